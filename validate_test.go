package pgcluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// skipCounts counts a build's skipped rows by reason.
func skipCounts(s *snapshot) map[string]int {
	counts := map[string]int{}
	for _, sk := range allSkipped(s) {
		counts[sk.reason]++
	}
	return counts
}

// An alias loop is reported as alias_loop whatever its length, as is a
// chain that leads into one; a long chain to nothing is alias_dangling.
// Only a chain that reaches a cluster more than maxChain aliases away is
// alias_too_deep. Each is skipped, and the rest are served.
func TestAliasLoopAnyLength(t *testing.T) {
	var aliases []Alias
	chain := func(prefix string, n int, end string) {
		for i := range n {
			target := fmt.Sprintf("%s%d", prefix, i+1)
			if i == n-1 {
				target = end
			}
			aliases = append(aliases, Alias{Alias: fmt.Sprintf("%s%d", prefix, i), Target: target})
		}
	}
	chain("loop", 1000, "loop0")   // a loop of 1,000 aliases
	chain("into", 50, "loop500")   // 50 aliases into it
	chain("self", 1, "self0")      // an alias to itself
	chain("nowhere", 20, "gone")   // 20 aliases to nothing
	chain("deep", 20, "local")     // 20 aliases to a cluster: the first 12 too far
	chain("near", maxChain, "pg1") // maxChain aliases to... a node's name: nothing
	p := newTestPlugin(buildInput{nodes: testNodes(), aliases: append(aliases, testAliases...)})
	s := p.snapshot()
	want := map[string]int{skipAliasLoop: 1000 + 50 + 1, skipAliasDangling: 20 + maxChain, skipAliasTooDeep: 20 - maxChain}
	got := skipCounts(s)
	for reason, n := range want {
		if got[reason] != n {
			t.Errorf("%s: %d skipped, want %d (all: %v)", reason, got[reason], n, got)
		}
	}
	for _, q := range []struct {
		name  string
		rcode int
	}{
		{"loop0.", dns.RcodeNameError},
		{"loop999.", dns.RcodeNameError},
		{"into0.", dns.RcodeNameError},
		{"self0.", dns.RcodeNameError},
		{"nowhere0.", dns.RcodeNameError},
		{"deep0.", dns.RcodeNameError},
		{"deep12.", dns.RcodeSuccess}, // 8 aliases from local
		{"myapp-db.", dns.RcodeSuccess},
	} {
		if r := query(t, p, q.name+testZone, dns.TypeA); r.Rcode != q.rcode {
			t.Errorf("%s: %s, want %s", q.name, dns.RcodeToString[r.Rcode], dns.RcodeToString[q.rcode])
		}
	}
}

// Aliases are followed once each: a chain of 100,000 aliases (into a loop)
// resolves in time linear in its length, not quadratic.
func TestAliasLongChainLinear(t *testing.T) {
	const n = 100_000
	aliases := make([]Alias, n)
	for i := range aliases {
		aliases[i] = Alias{Alias: fmt.Sprintf("a%d", i), Target: fmt.Sprintf("a%d", (i+1)%n)}
	}
	set := &settings{zones: []string{testZone}, ttl: 5}
	start := time.Now()
	s := build(buildInput{settings: set, nodes: testNodes(), aliases: aliases})
	took := time.Since(start)
	if got := skipCounts(s)[skipAliasLoop]; got != n {
		t.Errorf("%d aliases reported alias_loop, want %d", got, n)
	}
	t.Logf("a loop of %d aliases resolved in %v", n, took.Round(time.Millisecond))
	// Quadratic work would be 10^10 steps: minutes. Linear is well under a
	// second; the bound is generous for a loaded machine with -race.
	if took > 30*time.Second {
		t.Errorf("a loop of %d aliases took %v to resolve", n, took)
	}
}
