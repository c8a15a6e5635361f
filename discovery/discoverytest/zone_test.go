package discoverytest

import (
	"net/netip"
	"testing"

	"github.com/miekg/dns"
)

func TestZone(t *testing.T) {
	s := NewServer(t, "pgcluster.lan")
	a := netip.MustParseAddrPort("127.0.0.2:5433")
	b := netip.MustParseAddrPort("127.0.0.3:5434")
	s.SetCluster("local", Node{Name: "n1", Addr: a, Role: "primary"}, Node{Name: "n2", Addr: b, Role: "standby"})
	s.SetAlias("prod", "local")
	c := &dns.Client{}
	ask := func(name string, qtype uint16) *dns.Msg {
		t.Helper()
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		r, _, err := c.Exchange(m, s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	tests := []struct {
		name   string
		qtype  uint16
		rcode  int
		answer int
		extra  int
	}{
		{"local.pgcluster.lan.", dns.TypeA, dns.RcodeSuccess, 2, 0},
		{"local.pgcluster.lan.", dns.TypeAAAA, dns.RcodeSuccess, 0, 0},
		{"primary.local.pgcluster.lan.", dns.TypeA, dns.RcodeSuccess, 1, 0},
		{"replica.local.pgcluster.lan.", dns.TypeA, dns.RcodeSuccess, 1, 0},
		{"_postgresql._tcp.local.pgcluster.lan.", dns.TypeSRV, dns.RcodeSuccess, 2, 2},
		{"_postgresql._tcp.primary.local.pgcluster.lan.", dns.TypeSRV, dns.RcodeSuccess, 1, 1},
		{"prod.pgcluster.lan.", dns.TypeA, dns.RcodeSuccess, 3, 0},                    // CNAME + 2 A
		{"primary.prod.pgcluster.lan.", dns.TypeA, dns.RcodeSuccess, 2, 0},            // CNAME + A
		{"_postgresql._tcp.prod.pgcluster.lan.", dns.TypeSRV, dns.RcodeSuccess, 3, 2}, // CNAME + 2 SRV
		{"n2.local.pgcluster.lan.", dns.TypeA, dns.RcodeSuccess, 1, 0},
		{"nothing.pgcluster.lan.", dns.TypeA, dns.RcodeNameError, 0, 0},
		{"example.org.", dns.TypeA, dns.RcodeRefused, 0, 0},
	}
	for _, tc := range tests {
		r := ask(tc.name, tc.qtype)
		if r.Rcode != tc.rcode || len(r.Answer) != tc.answer || len(r.Extra) != tc.extra {
			t.Errorf("%s %s: rcode %s, %d answers, %d extra; want %s, %d, %d", tc.name, dns.TypeToString[tc.qtype],
				dns.RcodeToString[r.Rcode], len(r.Answer), len(r.Extra), dns.RcodeToString[tc.rcode], tc.answer, tc.extra)
		}
		if r.Rcode != dns.RcodeRefused && len(r.Answer) == 0 && len(r.Ns) != 1 {
			t.Errorf("%s: negative answer without SOA", tc.name)
		}
	}

	// Two nodes claiming to be primary: no primary.
	s.SetCluster("local", Node{Name: "n1", Addr: a, Role: "primary"}, Node{Name: "n2", Addr: b, Role: "primary"})
	if r := ask("primary.local.pgcluster.lan.", dns.TypeA); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 0 {
		t.Errorf("split brain: %v", r)
	}

	// Stopped, started again on the same port.
	s.Stop()
	if _, _, err := c.Exchange(new(dns.Msg).SetQuestion("local.pgcluster.lan.", dns.TypeA), s.Addr); err == nil {
		t.Error("a stopped server answered")
	}
	s.Start()
	if r := ask("local.pgcluster.lan.", dns.TypeA); len(r.Answer) != 2 {
		t.Errorf("after restart: %v", r)
	}
}
