package lock

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// Coming back after an outage to a Redis still loaded brings the fleet
// back to one prober per target without waiting for a read of every status
// to succeed: three instances × 500 targets (interval 2 s) local while
// Redis is stopped, then Redis back but pausing 0.6 s of every second
// (CLIENT PAUSE) for the four intervals after, so that a read of every
// status, paced over a cycle, meets a pause. From when every instance
// coordinates again (local until then, as Redis is not known back), each
// leaves the
// targets of the other live members to them after the return, probing
// only its own share, and reads the statuses still not covered in pieces
// of a round trip, each counting when it succeeds; so each interval from
// then has at most one and a half probes per target, and the fourth about
// one. When every returned instance probed every target no status
// since the return covered until one read of every status succeeded (and
// a failed one was tried again an interval later), the interval after the
// return had about one probe per target per instance.
func TestCoordinatorRejoinUnderLoad(t *testing.T) {
	const n, bucket, interval = 500, 100 * time.Millisecond, 2 * time.Second
	srv := redistest.Start(t)
	targets := targetsOn(t, n)
	f := startOutageFleet(t, srv, 3, targets, interval)
	srv.Stop()
	eventually(t, 10*time.Second, "every instance local with Redis stopped", f.allIn(ModeLocal))
	local := time.Now()
	eventually(t, 10*time.Second, "two intervals in local mode", func() bool { return time.Since(local) > 2*interval })
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	admin := srv.Client(t)
	pauses := 0
	var rejoined, end time.Time
	for end.IsZero() || time.Now().Before(end) {
		at := time.Now()
		if err := admin.Do(context.Background(), "CLIENT", "PAUSE", 600, "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		pauses++
		eventually(t, 10*time.Second, "a second since the last pause began", func() bool { return time.Since(at) >= time.Second })
		if !end.IsZero() {
			continue
		}
		if time.Since(back) > 20*time.Second {
			t.Fatal("after 20s: every instance coordinated again")
		}
		rejoined = back
		for _, m := range f.modes {
			at := m.coordinated()
			if at.Before(back) {
				rejoined = time.Time{}
				break
			}
			rejoined = later(rejoined, at)
		}
		if !rejoined.IsZero() {
			end = rejoined.Add(4 * interval)
		}
	}

	before := f.probesBetween(back.Add(-interval), back, interval)[0]
	after := f.probesBetween(rejoined, end, bucket)
	totals := perInterval(after, bucket, interval)
	t.Logf("probes in the interval of local mode before Redis came back: %d (every instance probing every target: %d)", before, len(f.ins)*n)
	t.Logf("every instance coordinated %v after Redis came back; probes per interval from then, Redis paused 0.6 s of every second (%d pauses): %v (one prober: %d); peak %d per %v",
		rejoined.Sub(back).Round(time.Millisecond), pauses, totals, n, slices.Max(windows2(after)), 2*bucket)
	t.Logf("probes per %v from then: %v", bucket, after)
	for i, m := range f.modes {
		if l := m.wentLocal(); len(l) > 1 {
			t.Errorf("instance %d went local again %v after Redis came back", i, l[1].Sub(back).Round(time.Millisecond))
		}
	}
	for i, got := range totals {
		if limit := n * 15 / 10; got > limit {
			t.Errorf("%d probes in interval %d after every instance coordinated again, over %d (one prober: %d)", got, i+1, limit, n)
		}
	}
	if last := totals[len(totals)-1]; last > n*12/10 {
		t.Errorf("%d probes in the fourth interval after every instance coordinated again, want about %d (one prober per target)", last, n)
	}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
