package lock

import (
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// Coming back from local mode goes back to one prober per target as each
// instance hears Redis again, and answers stay right on the way: 3
// coordinators × 150 targets (interval 1 s, rise and fall 1), Redis frozen
// (SIGSTOP) until every instance is local and for two intervals more, so
// that every instance probes every target. As Redis comes back, the backend of
// three targets stops. Each instance takes back at once the targets it
// held before the outage and writes what it found of them in local mode,
// and leaves the others' to them, so the interval after the last instance
// came back holds about one probe per target, where every instance
// probing every target until the owners took their leases back, an
// interval later, and probed them, held two to three. The stopped
// backend's targets leave every instance's answers within two intervals
// and a timeout of the return: an owner's next probe after its return, not a
// handoff later.
//
// The three intervals after the last instance came back are counted, past
// the handoff: a status written by an owner that came back before this
// instance, and heard here before its own return, counts as published
// since (else every instance that came back later probed those targets
// again as the handoff ended, until its read of every status: 224-238
// probes in the third interval).
//
// Both ways Redis goes: frozen (its keys kept: the leases may outlast the
// outage) and restarted empty (no member, lease or status left: the first
// instance back sees itself alone, and takes back only what it held).
func TestCoordinatorRejoinOneProber(t *testing.T) {
	for _, restart := range []bool{false, true} {
		name := "frozen"
		if restart {
			name = "restarted"
		}
		t.Run(name, func(t *testing.T) { testRejoinOneProber(t, restart) })
	}
}

func testRejoinOneProber(t *testing.T, restart bool) {
	const n, bucket = 150, 100 * time.Millisecond
	srv := redistest.Start(t)
	targets := targetsOn(t, n-3)
	stopping := newBackend(t)
	var flips []health.Target
	for i := range 3 {
		flips = append(flips, health.Target{Key: "flip/n" + string(rune('0'+i)), Addr: stopping.addr})
	}
	targets = append(targets, flips...)
	f := startOutageFleet(t, srv, 3, targets, outageInterval)
	thawed := false
	if restart {
		srv.Stop()
	} else {
		if err := srv.Freeze(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if !thawed {
				srv.Thaw()
			}
		})
	}
	eventually(t, 10*time.Second, "every instance local without Redis", f.allIn(ModeLocal))
	local := time.Now()
	eventually(t, 10*time.Second, "two intervals in local mode", func() bool { return time.Since(local) > 2*outageInterval })
	// An instance may hear Redis again before Start or Thaw returns
	// (under load, its heartbeat can come before their own check).
	returning := time.Now()
	if restart {
		if err := srv.Start(); err != nil {
			t.Fatal(err)
		}
	} else if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
	thawed = true
	back := time.Now()
	stopping.ln.Close()

	bound := 2*outageInterval + outageTimeout
	eventually(t, bound+10*time.Second, "every instance answers the stopped backend's targets Down", allState(f.ins, flips, health.Down))
	down := time.Since(back)
	var last time.Time
	eventually(t, 10*time.Second, "every instance coordinating again", func() bool {
		last = back
		for _, m := range f.modes {
			at := m.cameBack()
			if at.Before(returning) {
				return false
			}
			last = later(last, at)
		}
		return true
	})
	// Three intervals: past the handoff, when a target whose owner's
	// status did not count here would be probed again.
	end := last.Add(3 * outageInterval)
	eventually(t, 20*time.Second, "three intervals after the last instance came back", func() bool { return time.Now().After(end.Add(bucket)) })
	after := f.probesBetween(last, end, bucket)
	sums := perInterval(after, bucket, outageInterval)
	before := f.probesBetween(back.Add(-outageInterval), back, outageInterval)[0]
	t.Logf("probes in the interval before Redis came back (local mode): %d (every instance probing every target: %d)", before, len(f.ins)*n)
	t.Logf("every instance coordinating again %v after Redis came back; probes in each interval after: %v (one prober: %d), per %v: %v",
		last.Sub(back).Round(time.Millisecond), sums, n, bucket, after)
	t.Logf("the stopped backend's targets Down on every instance %v after Redis came back (bound %v)", down.Round(time.Millisecond), bound)
	if down > bound {
		t.Errorf("the stopped backend's targets Down on every instance %v after Redis came back, want within %v", down.Round(time.Millisecond), bound)
	}
	for i, sum := range sums {
		if limit := n * 13 / 10; sum > limit {
			t.Errorf("%d probes in interval %d after every instance came back, over %d (one prober: %d)", sum, i+1, limit, n)
		}
	}
	for i, m := range f.modes {
		if l := m.wentLocal(); len(l) > 1 {
			t.Errorf("instance %d went local again %v after Redis came back", i, l[1].Sub(back).Round(time.Millisecond))
		}
	}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
