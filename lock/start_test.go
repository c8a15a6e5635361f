package lock

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// probeLog records when each probe of a fleet started.
type probeLog struct {
	mu     sync.Mutex
	starts []time.Time
}

func (l *probeLog) observe(_, _ string, d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.starts = append(l.starts, time.Now().Add(-d))
}

// between counts the probes started in [from, to) per bucket.
func (l *probeLog) between(from, to time.Time, bucket time.Duration) []int {
	l.mu.Lock()
	defer l.mu.Unlock()
	counts := make([]int, (to.Sub(from)+bucket-1)/bucket)
	for _, at := range l.starts {
		if !at.Before(from) && at.Before(to) {
			counts[at.Sub(from)/bucket]++
		}
	}
	return counts
}

func sum(xs []int) int {
	n := 0
	for _, x := range xs {
		n += x
	}
	return n
}

// A fleet started at once joins without a storm: four instances × 300
// targets (interval 1 s), started together with the targets known, probe
// each target about once an interval from their start, not once per
// instance: each first reads the fleet's statuses, then takes its share
// of the leases a cycle and its stagger after its start and probes them,
// and leaves the other targets to their owners meanwhile. (Before, each
// probed every target nobody covered at once.)
func TestCoordinatorStartTogether(t *testing.T) {
	const n, m, interval = 4, 300, time.Second
	srv := redistest.Start(t)
	targets := targetsOn(t, m)
	log := &probeLog{}
	start := time.Now()
	var ins []*instance
	for range n {
		ins = append(ins, startChecked(t, newClient(t, srv), targets,
			Config{Prefix: "fleet:", Interval: interval, Timeout: outageTimeout, Logf: t.Logf},
			health.Config{Check: health.CheckTCP, Interval: interval, Timeout: outageTimeout, Rise: 1, Fall: 1, Observe: log.observe}))
	}
	eventually(t, 20*time.Second, "every instance sees every target up", allState(ins, targets, health.Up))
	up := time.Since(start)
	end := start.Add(2 * interval)
	eventually(t, 10*time.Second, "two intervals since the start", func() bool { return time.Now().After(end.Add(outageTimeout)) })
	per := log.between(start, end, interval/10)
	first, second := sum(per[:10]), sum(per[10:])
	t.Logf("%d instances x %d targets started together: every target up in every view after %v; probes in the first interval %d, in the second %d (%d a target: one prober); per 100 ms: %v",
		n, m, up.Round(time.Millisecond), first, second, m, per)
	// Twice one prober's: an owner whose first write misses its
	// deadline on a loaded machine has its targets probed by the others
	// once the handoff is over.
	if limit := 2 * m; first > limit || second > limit {
		t.Errorf("%d and %d probes in the first two intervals of a fleet started together, over %d: instances probe what other members hold", first, second, limit)
	}
}

// Coming back after an outage does not probe every target at once: three
// instances × 500 targets (interval 2 s) local while Redis is stopped,
// each probing every target at its own tick; when Redis returns, each
// takes its leases again without probing them at once (the ticks stay
// spread), so no 100 ms after the return sees more probe starts than the
// busiest of local mode; and within two intervals and a read of every
// status, each target has one prober again. (Before, each instance
// probed its share at once when it came back: a burst of 500 in a
// cycle.)
func TestCoordinatorRejoinProbeRamp(t *testing.T) {
	const n, bucket, interval = 500, 100 * time.Millisecond, 2 * time.Second
	srv := redistest.Start(t)
	targets := targetsOn(t, n)
	f := startOutageFleet(t, srv, 3, targets, interval)
	srv.Stop()
	eventually(t, 10*time.Second, "every instance local with Redis stopped", func() bool {
		for _, in := range f.ins {
			if in.coord.Mode() != ModeLocal {
				return false
			}
		}
		return true
	})
	local := time.Now()
	eventually(t, 10*time.Second, "two intervals in local mode", func() bool { return time.Since(local) > 2*interval })
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	eventually(t, 20*time.Second, "every instance coordinated again", func() bool {
		for _, in := range f.ins {
			if in.coord.Mode() != ModeCoordinated {
				return false
			}
		}
		return true
	})
	rejoined := time.Since(back)
	end := back.Add(3 * interval)
	eventually(t, 20*time.Second, "three intervals since Redis came back", func() bool { return time.Now().After(end.Add(outageTimeout)) })

	before := f.probesBetween(back.Add(-interval), back, bucket)
	after := f.probesBetween(back, end, bucket)
	perInterval := int(interval / bucket)
	var totals []int
	for i := 0; i < len(after); i += perInterval {
		totals = append(totals, sum(after[i:min(i+perInterval, len(after))]))
	}
	t.Logf("probe starts per %v in local mode, the interval before Redis came back (%d a target when every instance probes it): %v", bucket, len(f.ins), before)
	t.Logf("probe starts per %v from Redis back (every instance coordinated after %v): %v", bucket, rejoined.Round(time.Millisecond), after)
	t.Logf("probes per interval after the return: %v (one prober: %d)", totals, n)
	limit := slices.Max(before) + n*int(bucket)/int(interval)
	if peak := slices.Max(after); peak > limit {
		t.Errorf("a burst of %d probe starts in %v after Redis came back, over %d (the busiest %v of local mode and one prober's share)", peak, bucket, limit, bucket)
	}
	if last := totals[len(totals)-1]; last > n*13/10 {
		t.Errorf("%d probes in the third interval after Redis came back, want about %d (one prober per target)", last, n)
	}
}
