package pgcluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// An alias with a fallback moves, on every instance (the relay's follower,
// its reader, an instance without the relay: two of them may write), once
// its target has had no serving primary for failover_after, written once;
// a switchover inside the target never moves it; it stays on the fallback
// when its target serves again (sticky) until its row of
// pgcluster_alias_state is deleted (pgclusterctl failback); with failback
// auto it comes back by itself.
func TestAliasFailover(t *testing.T) {
	g, ins := drainFleet(t)
	g.pg.MustExec(t, `INSERT INTO pgcluster_nodes(cluster, name, address, role) VALUES
  ('dr', 'dr1', '192.0.2.11', 'primary'), ('dr', 'dr2', '192.0.2.12', 'standby');
UPDATE pgcluster_aliases SET fallback = '{dr}', failover_after = '1 second' WHERE alias = 'prod'`)
	onLocal := map[string][]string{"primary.prod.": {"192.0.2.1"}}
	onDR := map[string][]string{"primary.prod.": {"192.0.2.11"}}
	g.wait(10*time.Second, "prod on local", func() error { return namesAnswer(ins, onLocal) })
	g.wait(10*time.Second, "prod's fail-over state", func() error {
		for _, in := range ins {
			if txt := servedTXT(in.p, "_failover.prod."); txt != "target=local state=primary targets=local,dr failover_when=no_primary failover_after=1s failback=manual" {
				return fmt.Errorf("%s: _failover.prod's TXT: %s", in.name, txt)
			}
		}
		return nil
	})

	// A switchover inside local, in one statement: never without a
	// primary, never moved.
	g.pg.MustExec(t, "UPDATE pgcluster_nodes SET role = CASE name WHEN 'pg2' THEN 'primary' ELSE 'standby' END WHERE cluster = 'local'")
	g.wait(10*time.Second, "the switchover", func() error {
		return namesAnswer(ins, map[string][]string{"primary.prod.": {"192.0.2.2"}})
	})
	holdsFor(t, 2*time.Second, func() error {
		return namesAnswer(ins, map[string][]string{"primary.prod.": {"192.0.2.2"}})
	})

	moved := movesWritten()
	start := time.Now()
	g.pg.MustExec(t, "UPDATE pgcluster_nodes SET healthy = false WHERE name = 'pg2'")
	g.wait(15*time.Second, "prod on dr", func() error { return namesAnswer(ins, onDR) })
	t.Logf("local's primary out -> primary.prod answers dr's on all 3 instances: %v (failover_after 1s)", time.Since(start).Round(time.Millisecond))
	if took := time.Since(start); took < time.Second {
		t.Fatalf("moved %v after the primary left, before failover_after", took)
	}
	if got := movesWritten() - moved; got != 1 {
		t.Errorf("%v moves written, want 1", got)
	}
	for _, in := range ins {
		if txt := servedTXT(in.p, "_failover.prod."); !strings.Contains(txt, "target=dr state=failed_over") || !strings.Contains(txt, "moved=failed over from local at 20") || !strings.Contains(txt, "no serving primary in local for") {
			t.Errorf("%s: _failover.prod's TXT after the move: %s", in.name, txt)
		}
	}

	// local serves again: prod stays on dr.
	g.pg.MustExec(t, "UPDATE pgcluster_nodes SET healthy = true WHERE name = 'pg2'")
	holdsFor(t, 3*time.Second, func() error { return namesAnswer(ins, onDR) })

	// pgclusterctl failback deletes the row: back at once.
	g.pg.MustExec(t, "DELETE FROM pgcluster_alias_state WHERE alias = 'prod'")
	g.wait(10*time.Second, "failed back", func() error {
		return namesAnswer(ins, map[string][]string{"primary.prod.": {"192.0.2.2"}})
	})

	// failback auto: out and back by itself.
	g.pg.MustExec(t, "UPDATE pgcluster_aliases SET failback = 'auto' WHERE alias = 'prod'; UPDATE pgcluster_nodes SET healthy = false WHERE name = 'pg2'")
	g.wait(15*time.Second, "prod on dr again", func() error { return namesAnswer(ins, onDR) })
	g.pg.MustExec(t, "UPDATE pgcluster_nodes SET healthy = true WHERE name = 'pg2'")
	start = time.Now()
	g.wait(15*time.Second, "failed back by itself", func() error {
		return namesAnswer(ins, map[string][]string{"primary.prod.": {"192.0.2.2"}})
	})
	t.Logf("failback auto: back on local %v after its primary came back (failover_after 1s)", time.Since(start).Round(time.Millisecond))
}

// holdsFor checks cond every 50 ms for d, failing at its first error.
func holdsFor(t *testing.T, d time.Duration, cond func() error) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if err := cond(); err != nil {
			t.Fatal(fmt.Errorf("within %v: %w", d, err))
		}
	}
}

// movesWritten is alias_failover_writes_total{result="moved"} of the tests'
// zone, summed over the instances of this process.
func movesWritten() float64 {
	var m dto.Metric
	if err := failoverWrites.WithLabelValues(testZone, "moved").Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// Fallbacks an alias can never use are each named in a skip of their own,
// and the alias serves all the same, from its target; a fallback to a
// cluster without rows is named and kept.
func TestAliasFallbackVetted(t *testing.T) {
	nodes := append(testNodes(), node("dr", "dr1", "192.0.2.31", "primary"))
	aliases := []Alias{
		{Alias: "prod", Target: "local", Fallback: "prod,local,dr,dr,Bad_Label,myapp-db,nowhere"},
		{Alias: "myapp-db", Target: "prod"},
	}
	p := newTestPlugin(buildInput{settings: &settings{}, nodes: nodes, aliases: aliases})
	s := p.snapshot()
	var got []string
	for _, sk := range s.aliases.skipped {
		if sk.reason == skipInvalidFallback {
			got = append(got, sk.what)
		}
	}
	want := []string{
		`fallback "prod" of alias "prod": the alias itself (not used)`,
		`fallback "local" of alias "prod": named twice, or the alias's own target (not used)`,
		`fallback "dr" of alias "prod": named twice, or the alias's own target (not used)`,
		`fallback "Bad_Label" of alias "prod": not a DNS label (not used)`,
		`fallback "myapp-db" of alias "prod": an alias: a fallback is a cluster (not used)`,
		`fallback "nowhere" of alias "prod": no cluster "nowhere" serves now (kept: used once it does)`,
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("skips:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if a := addrs(t, p, "primary.prod."); a != "192.0.2.1" {
		t.Errorf("primary.prod answers %q, want local's primary", a)
	}
	// Moved (by someone's hand) to a target that is not one of its
	// fallbacks: the alias points at its own target.
	aliases[0].Moved = "other"
	p = newTestPlugin(buildInput{settings: &settings{}, nodes: nodes, aliases: aliases})
	if a := addrs(t, p, "primary.prod."); a != "192.0.2.1" {
		t.Errorf("moved to a target it does not list: primary.prod answers %q, want local's primary", a)
	}
	aliases[0].Moved = "DR"
	p = newTestPlugin(buildInput{settings: &settings{}, nodes: nodes, aliases: aliases})
	if a := addrs(t, p, "primary.prod."); a != "192.0.2.31" {
		t.Errorf("moved to dr: primary.prod answers %q, want dr's primary", a)
	}
}
