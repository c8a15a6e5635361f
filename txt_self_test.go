package pgcluster

import (
	"context"
	"net/netip"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"
)

// TestSelfTXT: with self, a node whose registry address is loopback is
// answered with the address self gives; its TXT shows that address, the
// one a client connects to, and the registry's as registry_address (where
// the checks connect). A node answered with its registry address has no
// registry_address.
func TestSelfTXT(t *testing.T) {
	nodes := []Node{
		node("local", "pg1", "127.0.0.1", "primary"),
		node("local", "pg2", "192.0.2.2", "standby"),
	}
	p := newTestPlugin(buildInput{nodes: nodes, settings: &settings{self: map[string]netip.Addr{"pg1": netip.MustParseAddr("192.0.2.100")}}})
	for _, tc := range []test.Case{
		{Qname: "pg1.local.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("pg1.local.pgcluster.lan. 5 IN A 192.0.2.100")}},
		{Qname: "pg1.local.pgcluster.lan.", Qtype: dns.TypeTXT, Answer: []dns.RR{
			test.TXT(`pg1.local.pgcluster.lan. 5 IN TXT "state=in" "role=primary" "address=192.0.2.100" "registry_address=127.0.0.1" "port=5432" "reason=serving"`),
		}},
		{Qname: "pg2.local.pgcluster.lan.", Qtype: dns.TypeTXT, Answer: []dns.RR{
			test.TXT(`pg2.local.pgcluster.lan. 5 IN TXT "state=in" "role=standby" "address=192.0.2.2" "port=5432" "reason=serving"`),
		}},
	} {
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		if _, err := p.ServeDNS(context.Background(), rec, tc.Msg()); err != nil {
			t.Fatal(err)
		}
		if err := test.SortAndCheck(rec.Msg, tc); err != nil {
			t.Errorf("%s %s: %v", tc.Qname, dns.TypeToString[tc.Qtype], err)
		}
	}
}
