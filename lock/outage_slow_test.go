package lock

import (
	"context"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// One slow call is not an outage, however long a deadline the latency
// seen gives it: three coordinators × 60 targets, interval 2 s (local mode
// after failures over two cycles: 2 s). Redis has answered slowly (calls
// of 0.6 s, which raise every instance's next deadline to four times
// that, within its bound: the window, 2 s), then stalls for 2.4 s (CLIENT
// PAUSE). The calls sent as the stall began fail 2 s later; the window
// counts from that first failure, and needs a call sent after it to fail
// too, while Redis answers again 0.4 s after it: no instance goes local,
// and the fleet keeps one probe per target per interval. Redis frozen for
// good (SIGSTOP) still puts every instance in local mode within four
// cycles and a call's longest deadline.
func TestCoordinatorSlowCallNoOutage(t *testing.T) {
	const n, interval = 60, 2 * time.Second
	const cycle = interval / 2
	srv := redistest.Start(t)
	targets := targetsOn(t, n)
	f := startOutageFleet(t, srv, 3, targets, interval)
	admin := srv.Client(t)
	pause := func(d time.Duration) time.Time {
		t.Helper()
		at := time.Now()
		if err := admin.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		return at
	}
	deadlines := func() []time.Duration {
		var out []time.Duration
		for _, in := range f.ins {
			out = append(out, in.coord.leases.lat.timeout())
		}
		return out
	}

	// Redis has been answering slowly (on a loaded machine, calls of
	// 0.6 s): each instance's next deadline grows from it, as far as its
	// bound lets it.
	const slow, stall = 600 * time.Millisecond, 2400 * time.Millisecond
	for _, in := range f.ins {
		in.coord.leases.lat.observe(slow)
	}
	t.Logf("deadlines of the next calls after Redis answered in %v: %v (the window: %v)", slow, deadlines(), 2*cycle)
	stalled := pause(stall)
	end := stalled.Add(2 * interval)
	eventually(t, 20*time.Second, "two intervals since the stall began", func() bool { return time.Now().After(end.Add(outageTimeout)) })

	steady := f.probesBetween(stalled.Add(-interval), stalled, interval)[0]
	after := f.probesBetween(stalled, end, interval)
	t.Logf("Redis stalled %v: %d Redis calls failed and were ridden out; probes per interval: %d before, %v from the stall on (one prober: %d)",
		stall, f.failures.Load(), steady, after, n)
	for i, m := range f.modes {
		if l := m.wentLocal(); len(l) > 0 {
			t.Errorf("instance %d went local %v after a %v stall began", i, l[0].Sub(stalled).Round(time.Millisecond), stall)
		}
	}
	if limit := 2 * n * 13 / 10; after[0]+after[1] > limit {
		t.Errorf("%d probes in the two intervals from the stall on, over %d (one prober: %d)", after[0]+after[1], limit, 2*n)
	}

	frozen := time.Now()
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Thaw() })
	bound := 4*cycle + MaxCallTimeout
	eventually(t, bound+5*time.Second, "every instance local with Redis frozen", f.allIn(ModeLocal))
	for i, m := range f.modes {
		l := m.wentLocal()
		took := l[len(l)-1].Sub(frozen)
		t.Logf("Redis frozen: instance %d local after %v (bound %v)", i, took.Round(time.Millisecond), bound)
		if took > bound+time.Second {
			t.Errorf("instance %d went local %v after Redis froze, want within %v", i, took, bound)
		}
	}
}
