package pgcluster

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
)

// query asks p and returns the reply, failing unless it packs.
func query(t *testing.T, p *PgCluster, name string, qtype uint16) *dns.Msg {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	p.ServeDNS(context.Background(), rec, m)
	if rec.Msg == nil {
		t.Fatalf("%s %s: no reply", name, dns.TypeToString[qtype])
	}
	if _, err := rec.Msg.Pack(); err != nil {
		t.Fatalf("%s %s: the reply does not pack: %v", name, dns.TypeToString[qtype], err)
	}
	return rec.Msg
}

// A cluster in split brain with many long-named primaries still has a TXT
// record that packs, naming a bounded number of them.
func TestSplitBrainTXTPacks(t *testing.T) {
	for _, tc := range []struct{ n, label int }{{5, 63}, {25, 10}, {300, 63}} {
		var nodes []Node
		for i := range tc.n {
			name := fmt.Sprintf("%0*d", tc.label, i)
			nodes = append(nodes, node("local", name, fmt.Sprintf("192.0.2.%d", i%250+1), "primary"))
		}
		p := newTestPlugin(buildInput{nodes: nodes})
		r := query(t, p, "local."+testZone, dns.TypeTXT)
		if len(r.Answer) != 1 {
			t.Fatalf("%d primaries: TXT answer %v", tc.n, r.Answer)
		}
		txt := r.Answer[0].(*dns.TXT).Txt
		all := strings.Join(txt, " ")
		if !strings.HasPrefix(all, fmt.Sprintf("serving=%d out=0 primary=", tc.n)) {
			t.Errorf("%d primaries: TXT %q", tc.n, all)
		}
		if listed := strings.Count(all, ",") + 1; tc.n > maxListed && !strings.Contains(all, fmt.Sprintf("+%d more", tc.n-maxListed)) {
			t.Errorf("%d primaries: should name %d and count the rest: %q (%d listed)", tc.n, maxListed, all, listed)
		}
		for _, s := range txt {
			if len(s) > 255 {
				t.Errorf("TXT string of %d bytes", len(s))
			}
		}
	}
}

// An alias chain longer than an answer may follow is skipped at load, with a
// reason; the chain up to that depth is served.
func TestAliasChainTooDeep(t *testing.T) {
	var aliases []Alias
	for i := 1; i <= 20; i++ {
		target := fmt.Sprintf("ch%d", i+1)
		if i == 20 {
			target = "local"
		}
		aliases = append(aliases, Alias{Alias: fmt.Sprintf("ch%d", i), Target: target})
	}
	p := newTestPlugin(buildInput{nodes: testNodes(), aliases: aliases})
	s := p.snapshot()
	deep := 0
	for _, sk := range allSkipped(s) {
		if sk.reason == skipAliasTooDeep {
			deep++
		}
	}
	if deep != 12 {
		t.Errorf("ch1..ch12 are more than %d hops from local: %d skipped (%v)", maxChain, deep, allSkipped(s))
	}
	for i := 1; i <= 20; i++ {
		r := query(t, p, fmt.Sprintf("primary.ch%d.%s", i, testZone), dns.TypeA)
		switch {
		case r.Rcode == dns.RcodeServerFailure:
			t.Errorf("ch%d: SERVFAIL", i)
		case i <= 12 && r.Rcode != dns.RcodeNameError:
			t.Errorf("ch%d: skipped, so NXDOMAIN; got %s", i, dns.RcodeToString[r.Rcode])
		case i > 12 && len(Addrs(r)) != 1:
			t.Errorf("ch%d: %v", i, r.Answer)
		}
	}
}

// Addrs returns the addresses in m's answer.
func Addrs(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out
}

// Of two aliases that differ only in case, the lower-case one wins, as for
// nodes.
func TestAliasCaseDuplicate(t *testing.T) {
	nodes := append(testNodes(), node("other2", "y1", "192.0.2.31", "primary"))
	for _, order := range [][]Alias{
		{{Alias: "UPPERALIAS", Target: "other"}, {Alias: "upperalias", Target: "other2"}},
		{{Alias: "upperalias", Target: "other2"}, {Alias: "UPPERALIAS", Target: "other"}},
	} {
		p := newTestPlugin(buildInput{nodes: nodes, aliases: order})
		r := query(t, p, "upperalias."+testZone, dns.TypeCNAME)
		if len(r.Answer) != 1 || r.Answer[0].(*dns.CNAME).Target != "other2."+testZone {
			t.Errorf("rows %v: the lower-case alias should win: %v", order, r.Answer)
		}
	}
}

// No owner name longer than 255 octets is built: such rows are skipped with a
// reason.
func TestNamesTooLong(t *testing.T) {
	zone := strings.Repeat("z", 63) + "." + strings.Repeat("y", 63) + "." + strings.Repeat("x", 40) + ".lan."
	l63 := func(c byte) string { return strings.Repeat(string(c), 63) }
	nodes := []Node{
		node(l63('c'), l63('n'), "192.0.2.1", "primary"), // node name 63+63+zone > 255
		node("short", l63('n'), "192.0.2.2", "primary"),  // fits
		node("short", "pg1", "192.0.2.3", "standby"),
		node(l63('d'), "pg1", "192.0.2.4", "primary"), // SRV of prefer-standby too long
	}
	aliases := []Alias{{Alias: l63('a'), Target: "short"}, {Alias: "al", Target: "short"}}
	s := build(buildInput{settings: &settings{zones: []string{zone}, ttl: 5}, nodes: nodes, aliases: aliases})
	for owner := range owners(s) {
		if _, ok := dns.IsDomainName(owner); !ok || len(owner)+1 > 255 {
			t.Errorf("owner name of %d octets built: %s", len(owner)+1, owner)
		}
	}
	n := 0
	for _, sk := range allSkipped(s) {
		if sk.reason == skipNameTooLong {
			n++
		}
	}
	if n != 3 {
		t.Errorf("want the two long clusters' rows and the long alias skipped: %v", allSkipped(s))
	}
	if got := addrsOf(entryOf(s, "short."+zone)); got != "192.0.2.2 192.0.2.3" {
		t.Errorf("the rows that fit are served: %q", got)
	}
	if entryOf(s, "al."+zone) == nil {
		t.Error("the short alias is served")
	}
}
