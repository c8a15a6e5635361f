package plugin

import (
	"slices"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
)

// TestDirectiveOrder checks the places the bundle relies on: pgcluster runs
// before file, and dnssec before pgcluster, so that dnssec sees (and signs)
// pgcluster's answers.
func TestDirectiveOrder(t *testing.T) {
	at := func(name string) int {
		i := slices.Index(dnsserver.Directives, name)
		if i < 0 {
			t.Fatalf("directive %s is not in the build's order", name)
		}
		return i
	}
	if pg, file := at(Directive), at("file"); pg > file {
		t.Errorf("pgcluster at %d, file at %d: want pgcluster before file", pg, file)
	}
	if sec, pg := at("dnssec"), at(Directive); sec > pg {
		t.Errorf("dnssec at %d, pgcluster at %d: want dnssec before pgcluster", sec, pg)
	}
}

// TestBundle checks that the plugins the README's Corefiles use are
// compiled in.
func TestBundle(t *testing.T) {
	plugins := caddy.ListPlugins()["others"]
	for _, want := range []string{"pgcluster", "dnssec", "bind", "file", "errors", "log", "prometheus", "ready"} {
		if !slices.Contains(plugins, "dns."+want) {
			t.Errorf("plugin %s is not in the build: %v", want, plugins)
		}
	}
}
