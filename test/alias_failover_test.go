package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// Alias fail-over with real servers: cluster local is pg1 (primary) and
// pg2 (its streaming standby), cluster dr is dr1 (a primary of its own);
// alias prod points at local, fallback dr. bin/coredns instances share the
// checks (check postgres) and the registry through Redis.
const (
	failoverAfter    = 3 * time.Second
	failoverInterval = time.Second
	failoverTimeout  = 800 * time.Millisecond
	failoverFall     = 3 // the default fall
	// failoverLease is the checks' lease: 3 intervals (see docs/fleet.md).
	failoverLease = 3 * failoverInterval
	primaryProd   = "primary.prod." + Zone
	failoverState = "_failover.prod." + Zone
)

// failoverBound is how long after local's primary stops primary.prod may
// take to answer dr's: failover_after, plus fall probes an interval apart
// and a timeout to see the primary down, plus a lease for a holder that
// was the one to go, plus a second for the write and its notification.
const failoverBound = failoverAfter + failoverFall*failoverInterval + failoverTimeout + failoverLease + time.Second

type failoverWorld struct {
	t                testing.TB
	reg              *pgtest.Postgres
	pg1, pg2, dr1    *pgtest.Postgres
	corefile         string
	ins              []*Instance
	pg1Addr, dr1Addr string
}

// failoverOptions are a failover world's: prod's failover_after and
// failback, and the checks' Corefile lines.
type failoverOptions struct {
	after    time.Duration
	failback string
	checks   string
}

// defaultFailover is the world of TestAliasFailoverFleet.
var defaultFailover = failoverOptions{after: failoverAfter, failback: "manual",
	checks: fmt.Sprintf("interval %v\n  timeout %v", failoverInterval, failoverTimeout)}

func newFailoverWorld(t testing.TB, instances int, o failoverOptions) *failoverWorld {
	t.Helper()
	w := &failoverWorld{t: t, pg1Addr: "127.0.0.91", dr1Addr: "127.0.0.93"}
	w.pg1 = pgtest.New(t, pgtest.Options{Host: w.pg1Addr})
	w.pg2 = pgtest.NewStandby(t, w.pg1, pgtest.Options{Host: "127.0.0.92"})
	w.dr1 = pgtest.New(t, pgtest.Options{Host: w.dr1Addr})
	w.reg = Registry(t)
	w.reg.MustExec(t, fmt.Sprintf(`INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES
  ('local', 'pg1', '127.0.0.91', %d, 'primary'), ('local', 'pg2', '127.0.0.92', %d, 'standby'),
  ('dr', 'dr1', '127.0.0.93', %d, 'primary');
INSERT INTO pgcluster_aliases (alias, target, fallback, failover_after, failback) VALUES ('prod', 'local', '{dr}', '%v', '%s')`,
		w.pg1.Port, w.pg2.Port, w.dr1.Port, o.after, o.failback))
	rs := redistest.Start(t)
	w.corefile = fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n prometheus 127.0.0.1:%s\n pgcluster {\n  postgres %s\n  redis %s\n  redis_secret %s\n  allow_loopback\n  ttl 1\n  check postgres \"user=postgres dbname=postgres sslmode=disable\"\n  %s\n }\n}\n",
		Zone, PortPlaceholder, MetricsPlaceholder, w.reg.DSN(""), rs.URL(), relaySecret, o.checks)
	w.ins = StartTogether(t, slices.Repeat([]string{w.corefile}, instances)...)
	Eventually(t, 30*time.Second, w.prodIs(w.ins, w.pg1Addr))
	return w
}

// prodIs checks that every instance of ins answers primary.prod with addr
// alone.
func (w *failoverWorld) prodIs(ins []*Instance, addr string) func() error {
	return func() error {
		for _, in := range ins {
			m, err := Exchange("udp", in.Addr(), primaryProd, dns.TypeA)
			if err != nil {
				return err
			}
			if got := Addrs(m); len(got) != 1 || got[0] != addr {
				return fmt.Errorf("%s: primary.prod answers %s %v, want %s", in.Addr(), dns.RcodeToString[m.Rcode], got, addr)
			}
		}
		return nil
	}
}

// target is where an instance says prod points (_failover.prod's target=),
// "" when it cannot tell.
func target(in *Instance) string {
	m, err := Exchange("udp", in.Addr(), failoverState, dns.TypeTXT)
	if err != nil {
		return ""
	}
	for _, rr := range m.Answer {
		if txt, ok := rr.(*dns.TXT); ok {
			for _, s := range txt.Txt {
				if t, ok := strings.CutPrefix(s, "target="); ok {
					return t
				}
			}
		}
	}
	return ""
}

// exec runs sql on the registry.
func (w *failoverWorld) exec(sql string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, w.reg.DSN(""))
	if err != nil {
		w.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		w.t.Fatalf("%s: %v", sql, err)
	}
}

// TestAliasFailoverFleet: a planned switchover inside local never moves
// prod; local's primary stopped, primary.prod answers dr's on every
// instance within failoverBound; local's primary back, prod stays on dr,
// also on an instance started afterwards; a fail-back (what pgclusterctl
// failback runs) moves it back; with failback auto it comes back by itself.
func TestAliasFailoverFleet(t *testing.T) {
	w := newFailoverWorld(t, 2, defaultFailover)
	pg2Addr := "127.0.0.92"

	// The switchover: pg1 stopped in fast mode, pg2 promoted at once.
	var sw sync.WaitGroup
	var stopErr error
	sw.Go(func() { stopErr = w.pg1.StopMode("fast") })
	if err := w.pg2.Promote(); err != nil {
		t.Fatal(err)
	}
	sw.Wait()
	if stopErr != nil {
		t.Fatal(stopErr)
	}
	switched := time.Now()
	Eventually(t, 20*time.Second, w.prodIs(w.ins, pg2Addr))
	t.Logf("switchover inside local: primary.prod answers pg2 on both instances %v after the promotion", time.Since(switched).Round(time.Millisecond))
	holdsFor(t, failoverAfter+2*time.Second, "after a switchover", func() error {
		for _, in := range w.ins {
			if tg := target(in); tg != "local" {
				return fmt.Errorf("%s: prod points at %q after a switchover", in.Addr(), tg)
			}
		}
		return nil
	})

	// local's primary stopped: dr, with both instances (a -race build under
	// make test) loaded by dnsperf through the move, its alias, its role
	// name and its TXT.
	perfBin, err := exec.LookPath(dnsperfPath)
	if err != nil {
		t.Fatalf("dnsperf is missing (the setup script installs it: apt-get install -y dnsperf): %v", err)
	}
	queries := []string{"prod A", "primary.prod A", "standby.prod A", "_failover.prod TXT", "local A", "dr A", "primary.dr A", "nope A"}
	var perf []*dnsperfRun
	for _, in := range w.ins {
		perf = append(perf, startDnsperf(t, perfBin, in.Addr(), queries))
	}
	if err := w.pg2.StopMode("immediate"); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	Eventually(t, failoverBound+10*time.Second, w.prodIs(w.ins, w.dr1Addr))
	took := time.Since(stopped)
	for i, p := range perf {
		r := p.stop(t)
		t.Logf("instance %d under dnsperf through the move: %s", i, r)
		if r.servfail > 0 || r.other > 0 || r.completed == 0 {
			t.Errorf("instance %d under dnsperf through the move: %s: want answers and no SERVFAIL", i, r)
		}
	}
	t.Logf("local's primary stopped: primary.prod answers dr's on both instances after %v (bound %v: failover_after %v + %d × interval %v + timeout %v + lease %v + 1s)",
		took.Round(time.Millisecond), failoverBound, failoverAfter, failoverFall, failoverInterval, failoverTimeout, failoverLease)
	if took < failoverAfter {
		t.Errorf("moved %v after local's primary stopped, before failover_after %v", took, failoverAfter)
	}
	if took > failoverBound {
		t.Errorf("moved %v after local's primary stopped, beyond the bound %v", took, failoverBound)
	}

	// local's primary back: prod stays on dr, on a new instance too.
	if err := w.pg2.Start(); err != nil {
		t.Fatal(err)
	}
	late := StartFleetInstance(t, w.corefile)
	all := append(w.ins, late)
	holdsFor(t, failoverAfter+2*time.Second, "with local's primary back", w.prodIs(all, w.dr1Addr))

	// The fail-back pgclusterctl failback makes.
	w.exec("DELETE FROM pgcluster_alias_state WHERE alias = 'prod'")
	Eventually(t, 10*time.Second, w.prodIs(all, pg2Addr))

	// failback auto.
	w.exec("UPDATE pgcluster_aliases SET failback = 'auto' WHERE alias = 'prod'")
	if err := w.pg2.StopMode("immediate"); err != nil {
		t.Fatal(err)
	}
	Eventually(t, failoverBound+10*time.Second, w.prodIs(all, w.dr1Addr))
	if err := w.pg2.Start(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	Eventually(t, failoverBound+10*time.Second, w.prodIs(all, pg2Addr))
	t.Logf("failback auto: primary.prod answers local's primary again on all %d instances %v after it started", len(all), time.Since(back).Round(time.Millisecond))

	// Each instance logged each move it saw, once: to dr, back, to dr,
	// back (the late one its start on dr for the first).
	for i, in := range all {
		var lines []string
		for _, l := range strings.Split(in.Log(), "\n") {
			if strings.Contains(l, `Alias "prod" points at`) {
				lines = append(lines, l[strings.Index(l, "Alias"):])
			}
		}
		if len(lines) != 4 {
			t.Errorf("instance %d logged %d moves of prod, want 4: %q", i, len(lines), lines)
		}
		if i == 0 {
			t.Logf("instance 0's lines: %q", lines)
		}
	}
}

// BenchmarkAliasFlap stops and starts local's primary (after a switchover
// to pg2, as in TestAliasFailoverFleet) every 2 s for FLAP_FOR (default
// 60s) with prod on failover_after 1s and failback auto, checks every
// 500 ms, and polls where each of 2 instances says prod points every
// 10 ms: it prints the moves seen and the longest time the instances
// disagreed. b.N is ignored: one run is one measurement.
//
//	go test -run '^$' -bench AliasFlap -benchtime 1x ./test/
func BenchmarkAliasFlap(b *testing.B) {
	flapFor := time.Minute
	if v := os.Getenv("FLAP_FOR"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("FLAP_FOR=%q: %v", v, err)
		}
		flapFor = d
	}
	w := newFailoverWorld(b, 2, failoverOptions{after: time.Second, failback: "auto",
		checks: "interval 500ms\n  timeout 400ms\n  fall 2\n  rise 2"})
	// pg1 leaves the cluster for good: pg2 is the primary that flaps.
	if err := w.pg1.StopMode("fast"); err != nil {
		b.Fatal(err)
	}
	if err := w.pg2.Promote(); err != nil {
		b.Fatal(err)
	}
	Eventually(b, 20*time.Second, w.prodIs(w.ins, "127.0.0.92"))

	// Each instance polled on its own every 2 ms: when its answer of
	// where prod points changed, and to what.
	type change struct {
		at     time.Time
		target string
	}
	begin := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	changes := make([][]change, len(w.ins))
	samples := make([]int, len(w.ins))
	for i, in := range w.ins {
		wg.Go(func() {
			tick := time.NewTicker(2 * time.Millisecond)
			defer tick.Stop()
			last := ""
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				tg := target(in)
				if tg == "" {
					continue // a reply lost on a loaded machine: no sample
				}
				samples[i]++
				if tg != last {
					changes[i] = append(changes[i], change{time.Now(), tg})
					last = tg
				}
			}
		})
	}
	end := time.Now().Add(flapFor)
	flaps := 0
	for time.Now().Before(end) {
		if err := w.pg2.StopMode("immediate"); err != nil {
			b.Fatal(err)
		}
		time.Sleep(2 * time.Second) // the flap's period is the measurement's input
		if err := w.pg2.Start(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		flaps++
	}
	close(stop)
	wg.Wait()
	var seen []string
	for _, c := range changes[0] {
		seen = append(seen, fmt.Sprintf("%s@%.1fs", c.target, c.at.Sub(begin).Seconds()))
	}
	fmt.Printf("alias flap: local's primary stopped and started %d times, every 2s for %v; samples every 2ms per instance: %v; instance 0 saw prod point: %v\n", flaps, flapFor, samples, seen)
	if len(changes[0]) != len(changes[1]) {
		fmt.Printf("alias flap: the instances saw %d and %d changes: %v / %v\n", len(changes[0]), len(changes[1]), changes[0], changes[1])
		b.Fatal("the instances did not see the same moves")
	}
	var apart []time.Duration
	for k := range changes[0] {
		if changes[0][k].target != changes[1][k].target {
			b.Fatalf("move %d: the instances moved to %s and %s", k, changes[0][k].target, changes[1][k].target)
		}
		apart = append(apart, max(changes[0][k].at.Sub(changes[1][k].at), changes[1][k].at.Sub(changes[0][k].at)))
	}
	fmt.Printf("alias flap: over %d moves the 2 instances disagreed on prod's target for p50 %v, max %v (polls every 2ms)\n",
		len(apart), percentile(apart, 50), percentile(apart, 100))
}
