package lock

import (
	"context"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// A change after a quiet spell makes a View at once; a burst of changes
// (one a millisecond for half a second: a fleet started together hears
// about that many statuses) makes one View per paceFloor at most, not
// one per change, and the last change is in a View within paceCeil of
// the burst's end.
func TestCoordinatorViewsPaced(t *testing.T) {
	srv := redistest.Start(t)
	in := startChecked(t, srv.Client(t), targetsOn(t, 20),
		Config{Prefix: "paced:", Interval: fleetInterval, Timeout: fleetTimeout},
		health.Config{Check: health.CheckTCP, Interval: fleetInterval, Timeout: fleetTimeout, Rise: 1, Fall: 1})
	views := func() int {
		in.mu.Lock()
		defer in.mu.Unlock()
		return in.views
	}
	eventually(t, 10*time.Second, "a first View", func() bool { return views() > 0 })
	// Quiet: the checker's own verdicts no longer change.
	eventually(t, 10*time.Second, "no View for 300 ms", func() bool {
		v := views()
		time.Sleep(300 * time.Millisecond)
		return views() == v
	})

	change := func() {
		in.coord.mu.Lock()
		defer in.coord.mu.Unlock()
		in.coord.signal()
	}
	v := views()
	asked := time.Now()
	change()
	eventually(t, time.Second, "a View for a change after a quiet spell", func() bool { return views() > v })
	if took := time.Since(asked); took > 100*time.Millisecond {
		t.Errorf("a change after a quiet spell waited %v for its View, want it at once", took)
	}

	const burst = 500
	v = views()
	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	for range burst {
		<-tick.C
		change()
	}
	tick.Stop()
	elapsed := time.Since(start)
	ended := time.Now()
	during := views() - v
	eventually(t, time.Second, "a View after the burst's last change", func() bool { return views() > v+during })
	after := time.Since(ended)
	t.Logf("%d changes over %v made %d Views; the last change's View came %v after it", burst, elapsed.Round(time.Millisecond), during, after.Round(time.Millisecond))
	if most := int(elapsed/paceFloor) + 2; during > most {
		t.Errorf("%d changes over %v made %d Views, want at most %d (one per %v)", burst, elapsed, during, most, paceFloor)
	}
	if after > paceCeil+100*time.Millisecond {
		t.Errorf("the burst's last change waited %v for its View, want at most %v", after, paceCeil)
	}
}

// The pacer runs at once after a quiet spell, and spaces runs by
// paceShare times the last one's duration, within [paceFloor, paceCeil].
func TestPacerSpacing(t *testing.T) {
	ctx := context.Background()
	var p pacer
	for _, tc := range []struct {
		took, want time.Duration
	}{
		{0, paceFloor},
		{time.Millisecond, paceShare * time.Millisecond},
		{time.Second, paceCeil},
	} {
		p.ran(time.Now())
		p.took = tc.took
		start := time.Now()
		if err := p.wait(ctx); err != nil {
			t.Fatal(err)
		}
		if got := time.Since(start); got < tc.want-time.Millisecond {
			t.Errorf("after a run of %v: waited %v, want %v", tc.took, got, tc.want)
		}
	}
	p.done = time.Now().Add(-time.Second)
	start := time.Now()
	if err := p.wait(ctx); err != nil {
		t.Fatal(err)
	}
	if got := time.Since(start); got > paceFloor {
		t.Errorf("after a quiet spell: waited %v, want no wait", got)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	p.ran(time.Now())
	p.took = time.Second
	if err := p.wait(cctx); err == nil {
		t.Error("a wait whose context is done returned no error")
	}
}
