package discoverytest

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// primary.C.Z carries the primary's state in TXT, in pgcluster's words,
// with the addresses that go with each state.
func TestZonePrimaryState(t *testing.T) {
	s := NewServer(t, "pgcluster.lan")
	a := Node{Name: "n1", Addr: netip.MustParseAddrPort("127.0.0.2:5433"), Role: "primary"}
	b := Node{Name: "n2", Addr: netip.MustParseAddrPort("127.0.0.3:5434"), Role: "standby"}
	s.SetAlias("prod", "local")
	ask := func(name string, qtype uint16) *dns.Msg {
		t.Helper()
		r, _, err := (&dns.Client{}).Exchange(new(dns.Msg).SetQuestion(name, qtype), s.Addr)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	txt := func(name string) string {
		t.Helper()
		var out []string
		for _, rr := range ask(name, dns.TypeTXT).Answer {
			if x, ok := rr.(*dns.TXT); ok {
				out = append(out, strings.Join(x.Txt, " "))
			}
		}
		return strings.Join(out, " | ")
	}
	addrs := func(name string) []string {
		t.Helper()
		var out []string
		for _, rr := range ask(name, dns.TypeA).Answer {
			if x, ok := rr.(*dns.A); ok {
				out = append(out, x.A.String())
			}
		}
		return out
	}
	check := func(what, wantTXT string, wantAddrs ...string) {
		t.Helper()
		for _, name := range []string{"primary.local.pgcluster.lan.", "primary.prod.pgcluster.lan."} {
			if got := txt(name); got != wantTXT {
				t.Errorf("%s: TXT of %s = %q, want %q", what, name, got, wantTXT)
			}
			if got := addrs(name); !slices.Equal(got, wantAddrs) {
				t.Errorf("%s: A of %s = %v, want %v", what, name, got, wantAddrs)
			}
		}
	}

	s.SetCluster("local", a, b)
	check("one primary", "state=serving node=n1", "127.0.0.2")

	a.Role = "standby"
	s.SetCluster("local", b)
	s.HoldPrimary("local", a)
	check("held", "state=held node=n1", "127.0.0.2")
	if got := addrs("local.pgcluster.lan."); !slices.Equal(got, []string{"127.0.0.3"}) {
		t.Errorf("held: the cluster's answer is %v, want the serving standby alone", got)
	}

	b.Role = "primary"
	s.SetCluster("local", b)
	check("a new primary while one is held", "state=serving node=n2", "127.0.0.3")

	b.Role = "standby"
	s.SetCluster("local", b)
	s.ReleasePrimary("local")
	check("none", "state=none")

	a.Role, b.Role = "primary", "primary"
	s.SetCluster("local", a, b)
	check("split brain", "state=split_brain primaries=2")

	s.SetStateTXT(false)
	check("an older server", "")
}
