package lock

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// perInterval sums counts, buckets of bucket each, per interval.
func perInterval(counts []int, bucket, interval time.Duration) []int {
	n := int(interval / bucket)
	var out []int
	for i := 0; i < len(counts); i += n {
		s := 0
		for _, c := range counts[i:min(i+n, len(counts))] {
			s += c
		}
		out = append(out, s)
	}
	return out
}

// A fleet started at once joins without a storm: four instances × 300
// targets (interval 1 s), started together with the targets known, probe
// each target about once an interval from their start, not once per
// instance: each first joins and reads the fleet's statuses, then takes
// its share of the leases a cycle and its stagger after its start and
// probes them as it takes them, and leaves the other targets to their
// owners meanwhile. Each probing every target nobody covered yet made
// 1,270 and 972 probes in the first two intervals (2,394 in a later run).
// The bound, one and a half times one prober's over the two intervals,
// leaves room for an owner whose first write misses its deadline on a
// loaded machine (the others probe its targets once the handoff is over),
// and each instance that went local in that time (a Redis call longer
// than two cycles on a loaded machine) may add a probe of every target
// per interval: that is local mode's own load, measured elsewhere.
func TestCoordinatorStartTogether(t *testing.T) {
	const n, m, interval, bucket = 4, 300, time.Second, 100 * time.Millisecond
	srv := redistest.Start(t)
	targets := targetsOn(t, m)
	log := &probeLog{}
	start := time.Now()
	var ins []*instance
	var ms []*modes
	for range n {
		mo := &modes{}
		ms = append(ms, mo)
		ins = append(ins, startChecked(t, newClient(t, srv), targets,
			Config{Prefix: "fleet:", Interval: interval, Timeout: outageTimeout, Logf: t.Logf, Observer: mo},
			health.Config{Check: health.CheckTCP, Interval: interval, Timeout: outageTimeout, Rise: 1, Fall: 1, Observe: log.observe}))
	}
	end := start.Add(2 * interval)
	eventually(t, 10*time.Second, "two intervals since the start", func() bool { return time.Now().After(end.Add(outageTimeout)) })
	local := 0
	for _, mo := range ms {
		if l := mo.wentLocal(); len(l) > 0 && l[0].Before(end) {
			local++
		}
	}
	per := log.between(start, end, bucket)
	totals := perInterval(per, bucket, interval)
	limit := 3*m + local*2*m
	t.Logf("%d instances x %d targets started together: probes per interval %v (%d a target: one prober), limit over both %d (%d instances went local); per %v: %v",
		n, m, totals, m, limit, local, bucket, per)
	if totals[0]+totals[1] > limit {
		t.Errorf("%d probes in the first two intervals of a fleet started together, over %d (one prober: %d): instances probe what other members hold",
			totals[0]+totals[1], limit, 2*m)
	}
	eventually(t, 60*time.Second, "every instance sees every target up", allState(ins, targets, health.Up))
	t.Logf("every target up in every view after %v", time.Since(start).Round(time.Millisecond))
}

// Coming back after an outage does not probe every target at once: three
// instances × 500 targets (interval 2 s) local while Redis is stopped,
// each probing every target at its own tick; when Redis returns, each
// takes its leases again after a cycle and its stagger without probing
// them at once (their ticks stay spread as in local mode), so no 200 ms
// window after the return sees more probe starts than the busiest of
// local mode and twice one prober's average; and the interval after the
// third has about one prober per target. Each instance probing its share
// as it took it back put 441 probe starts into one 100 ms (limit 291).
// The windows are two 100 ms buckets wide, sliding by one, so that a
// burst is counted whole wherever a bucket boundary splits it.
func TestCoordinatorRejoinProbeRamp(t *testing.T) {
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
	eventually(t, 20*time.Second, "every instance coordinated again", f.allIn(ModeCoordinated))
	rejoined := time.Since(back)
	end := back.Add(4 * interval)
	eventually(t, 20*time.Second, "four intervals since Redis came back", func() bool { return time.Now().After(end.Add(outageTimeout)) })

	before := f.probesBetween(back.Add(-interval), back, bucket)
	after := f.probesBetween(back, end, bucket)
	totals := perInterval(after, bucket, interval)
	t.Logf("probe starts per %v in local mode, the interval before Redis came back (%d an interval when every instance probes every target): %v", bucket, len(f.ins)*n, before)
	t.Logf("probe starts per %v from Redis back (every instance coordinated after %v): %v", bucket, rejoined.Round(time.Millisecond), after)
	t.Logf("probes per interval after the return: %v (one prober: %d)", totals, n)
	share := n * int(2*bucket) / int(interval) // one prober's average per window
	limit := slices.Max(windows2(before)) + 2*share
	peak := slices.Max(windows2(after))
	t.Logf("peak %d probe starts per %v after the return, limit %d", peak, 2*bucket, limit)
	if peak > limit {
		t.Errorf("a burst of %d probe starts in %v after Redis came back, over %d (the busiest %v of local mode and twice one prober's average)", peak, 2*bucket, limit, 2*bucket)
	}
	if last := totals[len(totals)-1]; last > n*15/10 {
		t.Errorf("%d probes in the fourth interval after Redis came back, want about %d (one prober per target)", last, n)
	}
}

// resyncs counts the reads of every stored status that failed.
type resyncs struct {
	modes
	failed atomic.Int64
}

func (r *resyncs) Resync(err error) {
	if err != nil {
		r.failed.Add(1)
	}
}

// An instance whose first read of the fleet's statuses fails (one that
// misses its deadline as a fleet starts together on a loaded machine)
// does not wait for the safety net's read to know them: the holders'
// watermarks, read at its heartbeats, say that it missed what they
// published, and it reads their statuses again (a gap). Until then it
// knows nothing of the targets whose statuses do not change (they are
// rewritten, not published): a passive instance answers none of them, an
// active one probes them all itself. Here an ACL refuses the reads of
// every status (SCAN), then allows them.
func TestCoordinatorFirstReadFails(t *testing.T) {
	srv := redistest.Start(t)
	admin := newClient(t, srv)
	_, targets := newBackends(t, 6)
	a := startInstance(t, newClient(t, srv), targets, func(c *Config) { c.Resync = time.Minute })
	eventually(t, 10*time.Second, "the holder sees every backend up", allState([]*instance{a}, targets, health.Up))

	ctx := context.Background()
	if err := admin.Do(ctx, "ACL", "SETUSER", "late", "on", ">pw", "~*", "&*", "+@all", "-scan").Err(); err != nil {
		t.Fatal(err)
	}
	late := newClient(t, srv, func(o *redis.Options) { o.Username, o.Password = "late", "pw" })
	obs := &resyncs{}
	p := startPassive(t, late, targets, Config{Prefix: "fleet:", Interval: fleetInterval, Timeout: fleetTimeout, Resync: time.Minute, Logf: t.Logf, Observer: obs})
	eventually(t, 10*time.Second, "the passive instance's first read of every status fails", func() bool { return obs.failed.Load() > 0 })
	if allState([]*instance{p}, targets, health.Up)() {
		t.Fatal("the passive instance knows every status though it could not read them: the test shows nothing")
	}
	if err := admin.Do(ctx, "ACL", "SETUSER", "late", "+scan").Err(); err != nil {
		t.Fatal(err)
	}
	// The safety net's read comes half a resync (30 s) after the start at
	// the earliest; a gap is found two cycles and a Redis call (2.1 s
	// here) after a heartbeat.
	eventually(t, 5*time.Second, "the passive instance reads every status once allowed", allState([]*instance{p}, targets, health.Up))
}
