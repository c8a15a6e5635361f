package test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// drainWorld is a registry of one cluster of three nodes, a redis-server,
// two bin/coredns instances that share the registry through the relay and
// one that reads PostgreSQL itself (no redis): what a drain does must
// reach both kinds.
type drainWorld struct {
	t        testing.TB
	pg       *pgtest.Postgres
	conn     *pgx.Conn
	relayed  string // the relay instances' Corefile
	ins      []*Instance
	relayOff int // the index in ins of the instance without the relay
}

// drainNodes are local's nodes: pg1 the primary, pg2 and pg3 standbys.
var drainNodes = []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"}

func newDrainWorld(t testing.TB) *drainWorld {
	t.Helper()
	w := &drainWorld{t: t, pg: Registry(t)}
	w.pg.MustExec(t, `INSERT INTO pgcluster_nodes(cluster, name, address, role) VALUES
  ('local', 'pg1', '192.0.2.1', 'primary'), ('local', 'pg2', '192.0.2.2', 'standby'), ('local', 'pg3', '192.0.2.3', 'standby')`)
	rs := redistest.Start(t)
	w.relayed = fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n prometheus 127.0.0.1:%s\n pgcluster {\n  postgres %s\n  redis %s\n  redis_secret %s\n  refresh 1h\n }\n}\n",
		Zone, PortPlaceholder, MetricsPlaceholder, w.pg.DSN(""), rs.URL(), relaySecret)
	plain := fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n prometheus 127.0.0.1:%s\n pgcluster {\n  postgres %s\n  refresh 1h\n }\n}\n",
		Zone, PortPlaceholder, MetricsPlaceholder, w.pg.DSN(""))
	w.ins, w.relayOff = StartTogether(t, w.relayed, w.relayed, plain), 2
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, w.pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	w.conn = conn
	Eventually(t, 20*time.Second, clusterAnswers(w.ins, drainNodes...))
	return w
}

// exec runs sql on the registry and returns when it returned.
func (w *drainWorld) exec(sql string, args ...any) time.Time {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := w.conn.Exec(ctx, sql, args...); err != nil {
		w.t.Fatalf("%s: %v", sql, err)
	}
	return time.Now()
}

// clusterAnswers checks that every instance of ins answers local.<Zone>
// with exactly addrs (none: NODATA).
func clusterAnswers(ins []*Instance, addrs ...string) func() error {
	want := slices.Sorted(slices.Values(addrs))
	return func() error {
		for _, in := range ins {
			m, err := Exchange("udp", in.Addr(), relayName, dns.TypeA)
			if err != nil {
				return err
			}
			got := Addrs(m)
			slices.Sort(got)
			if m.Rcode != dns.RcodeSuccess || !slices.Equal(got, want) {
				return fmt.Errorf("%s answers %s %v, want %v", in.Addr(), dns.RcodeToString[m.Rcode], got, want)
			}
		}
		return nil
	}
}

// answeredBy returns, for each instance, when it first answered
// local.<Zone> with exactly addrs (polled every servedPoll), failing the
// test after timeout.
func answeredBy(t testing.TB, ins []*Instance, timeout time.Duration, addrs ...string) []time.Time {
	t.Helper()
	at := make([]time.Time, len(ins))
	errs := make([]error, len(ins))
	var wg sync.WaitGroup
	for i, in := range ins {
		wg.Go(func() {
			deadline := time.Now().Add(timeout)
			check := clusterAnswers([]*Instance{in}, addrs...)
			for {
				err := check()
				if err == nil {
					at[i] = time.Now()
					return
				}
				if time.Now().After(deadline) {
					errs[i] = err
					return
				}
				time.Sleep(servedPoll)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("not within %v: %v", timeout, err)
		}
	}
	return at
}

// drainCycles drains pg2 and deletes the drain n times, and returns the
// times from each COMMIT until the instances of the relay, and the
// instance without it, answered accordingly.
func (w *drainWorld) drainCycles(n int) (relayed, plain []time.Duration) {
	w.t.Helper()
	others := []string{"192.0.2.1", "192.0.2.3"}
	for i := range 2 * n {
		var at time.Time
		want := drainNodes
		if i%2 == 0 {
			at = w.exec("INSERT INTO pgcluster_drains (cluster, node, reason) VALUES ('local', 'pg2', 'reindex')")
			want = others
		} else {
			at = w.exec("DELETE FROM pgcluster_drains")
		}
		times := answeredBy(w.t, w.ins, 10*time.Second, want...)
		for k, tm := range times {
			if k == w.relayOff {
				plain = append(plain, tm.Sub(at))
			} else {
				relayed = append(relayed, tm.Sub(at))
			}
		}
	}
	return relayed, plain
}

// timedDrain drains pg2 for lasts (until now() + lasts, PostgreSQL's clock
// on this machine) and returns how far from that moment each instance
// answered it again.
func (w *drainWorld) timedDrain(lasts time.Duration) []time.Duration {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var until time.Time
	if err := w.conn.QueryRow(ctx, `INSERT INTO pgcluster_drains (cluster, node, reason, until)
  VALUES ('local', 'pg2', 'timed', now() + make_interval(secs => $1)) RETURNING until`, lasts.Seconds()).Scan(&until); err != nil {
		w.t.Fatal(err)
	}
	answeredBy(w.t, w.ins, 10*time.Second, "192.0.2.1", "192.0.2.3")
	var off []time.Duration
	for _, tm := range answeredBy(w.t, w.ins, lasts+10*time.Second, drainNodes...) {
		off = append(off, tm.Sub(until))
	}
	return off
}

// TestDrainFleet drains a node on real bin/coredns instances, two through
// the relay and one reading PostgreSQL itself: each drain and its deletion
// reach all three (COMMIT → answer figures in the log); a drain with an
// end ends by itself on every instance at that moment; a drain holds across
// a Corefile reload, an instance's restart and a hand-over of the relay.
// BenchmarkDrain measures the figures over more drains.
func TestDrainFleet(t *testing.T) {
	w := newDrainWorld(t)
	relayed, plain := w.drainCycles(5)
	t.Logf("drain COMMIT -> answered: through the relay p50 %v, max %v; without it p50 %v, max %v",
		percentile(relayed, 50), percentile(relayed, 100), percentile(plain, 50), percentile(plain, 100))
	off := w.timedDrain(2 * time.Second)
	t.Logf("a 2s drain ended on each instance this long after its until: %v", off)
	for _, d := range off {
		if d < -100*time.Millisecond || d > 5*time.Second {
			t.Errorf("a drain ended %v from its until", d)
		}
	}

	// Held across a reload, a restart and a relay hand-over.
	w.exec("INSERT INTO pgcluster_drains (cluster, node, reason) VALUES ('local', 'pg3', 'held')")
	Eventually(t, 10*time.Second, clusterAnswers(w.ins, "192.0.2.1", "192.0.2.2"))
	reloadTTL(t, w.ins[w.relayOff], 7)
	Eventually(t, 10*time.Second, clusterAnswers(w.ins, "192.0.2.1", "192.0.2.2"))
	relayIns := slices.Delete(slices.Clone(w.ins), w.relayOff, w.relayOff+1)
	f := oneFollower(t, relayIns, 15*time.Second)
	relayIns[f].Kill()
	rest := slices.Delete(slices.Clone(relayIns), f, f+1)
	restarted := StartFleetInstance(t, w.relayed)
	after := append(rest, restarted, w.ins[w.relayOff])
	Eventually(t, 20*time.Second, clusterAnswers(after, "192.0.2.1", "192.0.2.2"))
	oneFollower(t, append(rest, restarted), 15*time.Second)
	w.exec("DELETE FROM pgcluster_drains")
	Eventually(t, 10*time.Second, clusterAnswers(after, drainNodes...))
}

// BenchmarkDrain measures TestDrainFleet's figures over 50 drains and 50
// deletions, one drain of 30 s and five of 3 s. b.N is ignored: one run is one
// measurement.
//
//	go test -run '^$' -bench Drain -benchtime 1x ./test/
func BenchmarkDrain(b *testing.B) {
	w := newDrainWorld(b)
	relayed, plain := w.drainCycles(50)
	fmt.Printf("drain: COMMIT -> answered through the relay (2 instances, %d changes each): p50 %v, p99 %v, max %v\n",
		len(relayed)/2, percentile(relayed, 50), percentile(relayed, 99), percentile(relayed, 100))
	fmt.Printf("drain: COMMIT -> answered without the relay (%d changes): p50 %v, p99 %v, max %v\n",
		len(plain), percentile(plain, 50), percentile(plain, 99), percentile(plain, 100))
	long := w.timedDrain(30 * time.Second)
	fmt.Printf("drain: a 30s drain's end answered on each instance this long after its until: %v\n", long)
	var off []time.Duration
	for range 5 {
		off = append(off, w.timedDrain(3*time.Second)...)
	}
	fmt.Printf("drain: a 3s drain's end answered on each instance, from its until (%d ends): p50 %v, p99 %v, min %v, max %v\n",
		len(off), percentile(off, 50), percentile(off, 99), percentile(off, 0), percentile(off, 100))
}
