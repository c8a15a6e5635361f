package health

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// A tcp target goes Down after Fall failed connects and Up again after Rise
// accepted ones, within the time those take, over several flips.
func TestTCPDownAfterFallUpAfterRise(t *testing.T) {
	const (
		interval = 50 * time.Millisecond
		timeout  = 200 * time.Millisecond
		rise     = 3
		fall     = 2
		slack    = 700 * time.Millisecond // scheduling on a busy machine, under -race
	)
	var oks, fails atomic.Int32
	c := mustNew(t, Config{Check: CheckTCP, Interval: interval, Timeout: timeout, Rise: rise, Fall: fall,
		Observe: func(check, cause string, d time.Duration) {
			if check != CheckTCP {
				t.Errorf("Observe check %q, want tcp", check)
			}
			if cause == CauseOK {
				oks.Add(1)
			} else {
				fails.Add(1)
			}
		}})
	srv := listen(t, "127.0.0.1:0")
	c.SetTargets([]Target{{Key: "c/a", Addr: srv.addr}})
	rec, _ := start(t, c, 0)
	v := rec.waitVerdict("c/a", 2*time.Second, isState(Up, CauseOK))
	if v.Role != "" || v.WAL != 0 || v.Detail != "" || v.Last.IsZero() {
		t.Errorf("tcp verdict %+v: want no role, no WAL, no detail, a probe time", v)
	}
	for flip := range 3 {
		fails.Store(0)
		began := time.Now()
		srv.close()
		v := rec.waitVerdict("c/a", 3*time.Second, isState(Down, CauseRefused))
		took := time.Since(began)
		if n := fails.Load(); n < fall {
			t.Errorf("flip %d: Down after %d failed probes, want fall=%d", flip, n, fall)
		}
		if max := fall*interval + timeout + slack; took > max {
			t.Errorf("flip %d: Down after %v, want within fall*interval+timeout (+slack) = %v", flip, took, max)
		}
		if v.Detail == "" || len(v.Detail) > maxDetail {
			t.Errorf("flip %d: Down detail %q: want the error text, at most %d bytes", flip, v.Detail, maxDetail)
		}

		oks.Store(0)
		srv = listen(t, srv.addr.String())
		began = time.Now()
		rec.waitVerdict("c/a", 3*time.Second, isState(Up, CauseOK))
		took = time.Since(began)
		if n := oks.Load(); n < rise {
			t.Errorf("flip %d: Up after %d accepted probes, want rise=%d", flip, n, rise)
		}
		if max := rise*interval + slack; took > max {
			t.Errorf("flip %d: Up after %v, want within rise*interval (+slack) = %v", flip, took, max)
		}
	}
}

// SetTargets removes, adds and readdresses targets without disturbing the others.
func TestSetTargets(t *testing.T) {
	c := mustNew(t, Config{Check: CheckTCP, Interval: 30 * time.Millisecond, Timeout: 200 * time.Millisecond, Rise: 3, Fall: 3})
	srv, other := listen(t, "127.0.0.1:0"), listen(t, "127.0.0.1:0")
	a, b := Target{"c/a", srv.addr}, Target{"c/b", srv.addr}
	c.SetTargets([]Target{a, b})
	rec, _ := start(t, c, 0)
	rec.waitVerdict("c/a", 2*time.Second, isState(Up, CauseOK))
	rec.waitVerdict("c/b", 2*time.Second, isState(Up, CauseOK))

	_, before := rec.last()
	c.SetTargets([]Target{a})
	rec.waitVerdict("c/b", time.Second, absent)
	// a kept its goroutine and state: had it started over it would be Unknown
	// (absent) for Rise probes, but every View since has it Up.
	c.SetTargets([]Target{a, {"c/c", other.addr}})
	rec.waitVerdict("c/c", 2*time.Second, isState(Up, CauseOK))
	rec.mu.Lock()
	for i, v := range rec.views[before:] {
		if got := v.At("c/a"); got.State != Up {
			t.Errorf("View %d after removing c/b: c/a is %v, want it Up throughout", before+i, got.State)
		}
	}
	rec.mu.Unlock()

	// A new address for the same key starts that target over: Unknown
	// (absent) until Fall probes of the new address failed.
	c.SetTargets([]Target{{"c/a", refusedAddr(t)}, {"c/c", other.addr}})
	rec.waitVerdict("c/a", time.Second, absent)
	rec.waitVerdict("c/a", 2*time.Second, isState(Down, CauseRefused))
	if v, _ := rec.last(); v.At("c/c").State != Up {
		t.Errorf("c/c is %v after c/a moved, want Up", v.At("c/c").State)
	}
}

// Removing targets and cancelling Run cut probes in flight short: their
// sockets close at once, not after Timeout, and no goroutine is left. Run can
// then run again.
func TestNoLeakOnRemovalAndShutdown(t *testing.T) {
	const timeout = 5 * time.Second // far longer than any wait below
	hole := listen(t, "127.0.0.1:0")
	baseline := runtime.NumGoroutine()
	c := mustNew(t, Config{Check: CheckPostgres, Options: "user=postgres dbname=postgres sslmode=disable",
		Interval: 50 * time.Millisecond, Timeout: timeout})
	var ts []Target
	for i := range 5 {
		ts = append(ts, Target{fmt.Sprintf("c/n%d", i), hole.addr})
	}
	c.SetTargets(ts)
	for run := range 2 {
		_, stop := start(t, c, 0)
		if err := hole.waitOpen(5, 2*time.Second); err != nil {
			t.Fatalf("run %d: every target's probe should be in flight: %v", run, err)
		}
		c.SetTargets(ts[:2])
		if err := hole.waitOpen(2, time.Second); err != nil {
			t.Errorf("run %d: removed targets' probes still hold their sockets: %v", run, err)
		}
		stop()
		if err := hole.waitOpen(0, time.Second); err != nil {
			t.Errorf("run %d: sockets left open after Run returned: %v", run, err)
		}
		waitGoroutines(t, baseline, 2*time.Second)
		c.SetTargets(ts)
	}
}

// Many tcp targets: after Run returns no goroutine or connection is left.
func TestNoLeakManyTCPTargets(t *testing.T) {
	srv := listen(t, "127.0.0.1:0")
	baseline := runtime.NumGoroutine()
	c := mustNew(t, Config{Check: CheckTCP, Interval: 20 * time.Millisecond, Timeout: time.Second, Rise: 1})
	var ts []Target
	for i := range 200 {
		ts = append(ts, Target{fmt.Sprintf("c/n%d", i), srv.addr})
	}
	c.SetTargets(ts)
	rec, stop := start(t, c, 0)
	if err := pgtest.WaitFor(5*time.Second, func() error {
		v, _ := rec.last()
		if v.Len() != len(ts) {
			return fmt.Errorf("%d of %d targets judged", v.Len(), len(ts))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stop()
	if err := srv.waitOpen(0, 2*time.Second); err != nil {
		t.Error(err)
	}
	waitGoroutines(t, baseline, 2*time.Second)
}

// publish is never called concurrently, even when it is slow and many
// targets flip at once; the last View has every target's final state.
func TestPublishNeverConcurrent(t *testing.T) {
	srv := listen(t, "127.0.0.1:0")
	c := mustNew(t, Config{Check: CheckTCP, Interval: 20 * time.Millisecond, Timeout: 200 * time.Millisecond, Rise: 1, Fall: 1})
	var ts []Target
	for i := range 50 {
		ts = append(ts, Target{fmt.Sprintf("c/n%d", i), srv.addr})
	}
	c.SetTargets(ts)
	rec, _ := start(t, c, 15*time.Millisecond)
	all := func(s State) func() error {
		return func() error {
			v, _ := rec.last()
			n := 0
			for _, vd := range v.All() {
				if vd.State == s {
					n++
				}
			}
			if n != len(ts) {
				return fmt.Errorf("%d of %d targets %v", n, len(ts), s)
			}
			return nil
		}
	}
	if err := pgtest.WaitFor(5*time.Second, all(Up)); err != nil {
		t.Fatal(err)
	}
	_, ups := rec.last()
	srv.close()
	if err := pgtest.WaitFor(5*time.Second, all(Down)); err != nil {
		t.Fatal(err)
	}
	_, total := rec.last()
	// 100 transitions, spread over one interval by jitter, gathered into fewer Views.
	if n := total; n >= 2*len(ts) {
		t.Errorf("%d Views for %d transitions: changes are not coalesced", n, 2*len(ts))
	}
	t.Logf("%d transitions published in %d Views (%d to all Up)", 2*len(ts), total, ups)
}
