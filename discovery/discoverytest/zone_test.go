package discoverytest

import (
	"fmt"
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

// An answer too big for the client's buffer holds what fits, a different
// part each time, with the SRV targets' addresses; TC over UDP, and over
// TCP only when asked for.
func TestFit(t *testing.T) {
	s := NewServer(t, "pgcluster.lan")
	nodes := make([]Node, 3000)
	for i := range nodes {
		nodes[i] = Node{Name: fmt.Sprintf("n%d", i), Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 5432)}
	}
	s.SetCluster("local", nodes...)
	ask := func(network string, bufsize uint16) *dns.Msg {
		t.Helper()
		m := new(dns.Msg).SetQuestion("_postgresql._tcp.local.pgcluster.lan.", dns.TypeSRV)
		if bufsize > 0 {
			m.SetEdns0(bufsize, false)
		}
		r, _, err := (&dns.Client{Net: network}).Exchange(m, s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	for _, tc := range []struct {
		network string
		bufsize uint16
		limit   int
		tc      bool
	}{
		{"udp", 0, dns.MinMsgSize, true},
		{"udp", 1232, 1232, true},
		{"tcp", 0, dns.MaxMsgSize, false},
	} {
		a, b := ask(tc.network, tc.bufsize), ask(tc.network, tc.bufsize)
		a.Compress = true // as sent
		if a.Len() > tc.limit || a.Truncated != tc.tc || len(a.Answer) == 0 || len(a.Extra) != len(a.Answer) {
			t.Errorf("%s %d: %d bytes, TC %v, %d SRV, %d glue; want at most %d bytes, TC %v, one glue per SRV",
				tc.network, tc.bufsize, a.Len(), a.Truncated, len(a.Answer), len(a.Extra), tc.limit, tc.tc)
		}
		if a.Answer[0].(*dns.SRV).Target == b.Answer[0].(*dns.SRV).Target {
			t.Errorf("%s: two answers start with the same target", tc.network)
		}
	}
	s.SetGlue(false)
	s.SetTCOverTCP(true)
	if r := ask("tcp", 0); !r.Truncated || len(r.Extra) != 0 || len(r.Answer) < 1000 {
		t.Errorf("no glue, TC over TCP: TC %v, %d SRV, %d glue", r.Truncated, len(r.Answer), len(r.Extra))
	}
}
