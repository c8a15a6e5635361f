// Package plugin is the plugin bundle of the pgcluster CoreDNS build: the
// CoreDNS plugins it ships, plus pgcluster, placed in the directive order
// before file. cmd/coredns and the tests import it, so both run the same set.
package plugin

import (
	"slices"

	"github.com/coredns/coredns/core/dnsserver"

	// The CoreDNS plugins the build ships.
	_ "github.com/coredns/coredns/plugin/any"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/dnssec"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/file"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/rewrite"
	_ "github.com/coredns/coredns/plugin/root"
	_ "github.com/coredns/coredns/plugin/whoami"

	// pgcluster itself.
	_ "github.com/pgcluster/pgcluster"
)

// Directive is the name pgcluster takes in a Corefile.
const Directive = "pgcluster"

func init() {
	if slices.Contains(dnsserver.Directives, Directive) {
		return
	}
	i := slices.Index(dnsserver.Directives, "file")
	dnsserver.Directives = slices.Insert(dnsserver.Directives, i, Directive)
}
