package lock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// A holder does not rewrite a status whose verdict does not change at
// every probe: it stores it again once per rewrite period, and extends
// its lease meanwhile, so that the lease never lapses and the stored
// status never grows older than a reader trusts. A lease whose target it
// stops probing (a checker stuck) is not extended: it lapses.
func TestQuietStatusLeaseKept(t *testing.T) {
	s := redistest.Start(t)
	rdb := newClient(t, s)
	_, targets := newBackends(t, 1)
	tg := targets[0]
	cfg := Config{Prefix: "fleet:", Interval: fleetInterval, Timeout: fleetTimeout, Logf: t.Logf}
	coord, err := NewCoordinator(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	coord.SetTargets(targets)
	runInstance(t, coord, nil) // probed by hand below
	b := coord.b
	ctx := context.Background()
	lease, status := leaseKey(cfg.Prefix, tg.Key), statusKey(cfg.Prefix, tg.Key)
	ours := func() bool { v, _ := rdb.Get(ctx, lease).Result(); return v == coord.Token() }
	version := func() int64 { v, _ := rdb.HGet(ctx, status, "v").Int64(); return v }

	probe := func() {
		if ok, _ := coord.Claim(tg); ok {
			coord.Record(tg, health.Progress{Verdict: health.Verdict{State: health.Up, Cause: health.CauseOK, Last: time.Now()}, OK: 1})
		}
	}
	eventually(t, 10*time.Second, "the lease was not taken and the status written", func() bool {
		probe()
		return ours() && version() > 0
	})

	// Probed every interval with the same verdict, for ten rewrite periods.
	var probes, writes int
	last, lastAt := version(), time.Now()
	var oldest time.Duration
	end := time.Now().Add(10 * b.rewrite())
	next := time.Now()
	for time.Now().Before(end) {
		if !time.Now().Before(next) {
			probe()
			probes++
			next = next.Add(b.interval)
		}
		if !ours() {
			t.Fatalf("the lease lapsed or left this instance after %d probes of an unchanged verdict", probes)
		}
		if v := version(); v != last {
			writes++
			last, lastAt = v, time.Now()
		}
		oldest = max(oldest, time.Since(lastAt))
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d probes, %d status writes; the stored status at most %v old (rewrite period %v, readers trust %v)", probes, writes, oldest, b.rewrite(), b.storedAge())
	if writes > 12 || writes*3 > probes {
		t.Errorf("%d status writes for %d probes of an unchanged verdict over ten rewrite periods: rewritten at probes", writes, probes)
	}
	if oldest > b.storedAge() {
		t.Errorf("the stored status went %v without a rewrite, longer than readers trust a stored status (%v)", oldest, b.storedAge())
	}

	// No more probes: the lease is not extended again, and lapses.
	stopped := time.Now()
	eventually(t, 10*time.Second, "the lease of a target no longer probed did not lapse", func() bool { return !ours() })
	if d := time.Since(stopped); d < b.extendAfter() {
		t.Errorf("the lease lapsed %v after the last probe, before half a lease (%v): not extended while probed", d, b.extendAfter())
	}
}

// failCalls is a go-redis hook that fails every command and pipeline of one
// client while on, as a network that lost Redis for one instance would
// (its subscription's connection aside); with only, just the commands of
// that name (and a pipeline holding one), as a Redis that misses its
// deadlines for those. failed, when set, counts the calls it failed.
type failCalls struct {
	on     *atomic.Bool
	only   string
	failed *atomic.Int64
}

var errCutOff = errors.New("cut off from Redis (test)")

// fails reports whether the call of cmds fails now, and counts it when
// it does.
func (h failCalls) fails(cmds ...redis.Cmder) bool {
	if !h.on.Load() {
		return false
	}
	hit := h.only == ""
	for _, c := range cmds {
		hit = hit || c.Name() == h.only
	}
	if hit && h.failed != nil {
		h.failed.Add(1)
	}
	return hit
}

func (failCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h failCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if h.fails(cmd) {
			cmd.SetErr(errCutOff)
			return errCutOff
		}
		return next(ctx, cmd)
	}
}

func (h failCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if h.fails(cmds...) {
			for _, c := range cmds {
				c.SetErr(errCutOff)
			}
			return errCutOff
		}
		return next(ctx, cmds)
	}
}

// An instance that lost Redis alone, while the others went on, comes back
// to probing only its own share once the others' quiet statuses (stored
// before its return, and neither published nor rewritten since, see
// bounds.rewrite) have been rewritten: it reads every status again then,
// rather than probing the others' targets until its next safety read
// (every 5 minutes).
func TestQuietReturnAlone(t *testing.T) {
	const n, interval, timeout = 60, 400 * time.Millisecond, 200 * time.Millisecond
	srv := redistest.Start(t)
	targets := targetsOn(t, n)
	var cut atomic.Bool
	var mu sync.Mutex
	var probes []time.Time // instance 0's probe starts
	var ins []*instance
	for i := range 3 {
		rdb := newClient(t, srv)
		if i == 0 {
			rdb.AddHook(failCalls{on: &cut})
		}
		hc := health.Config{Check: health.CheckTCP, Interval: interval, Timeout: timeout, Rise: 1, Fall: 1}
		if i == 0 {
			hc.Observe = func(_, _ string, d time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				probes = append(probes, time.Now().Add(-d))
			}
		}
		ins = append(ins, startChecked(t, rdb, nil, Config{Prefix: "fleet:", Interval: interval, Timeout: timeout, Logf: t.Logf}, hc))
	}
	eventually(t, 20*time.Second, "every instance a member of the fleet", func() bool {
		for _, in := range ins {
			if in.coord.Members() != len(ins) {
				return false
			}
		}
		return true
	})
	for _, in := range ins {
		in.coord.SetTargets(targets)
		in.check.SetTargets(targets)
	}
	eventually(t, 20*time.Second, "every instance sees every target up", allState(ins, targets, health.Up))
	lone := ins[0].coord
	b := lone.b

	cut.Store(true)
	eventually(t, 20*time.Second, "the instance cut off from Redis local", func() bool { return lone.Mode() == ModeLocal })
	local := time.Now()
	eventually(t, 10*time.Second, "two intervals in local mode", func() bool { return time.Since(local) > 2*interval })
	cut.Store(false)
	eventually(t, 20*time.Second, "the instance coordinating again", func() bool { return lone.Mode() == ModeCoordinated })
	back := time.Now()

	// Its read of every status after the others' rewrites: a cycle, a
	// stagger (under a cycle), an interval and a timeout after its
	// return, and a rewrite period. An interval more for the probes
	// under way, then one interval counted.
	from := back.Add(b.rewrite() + 3*b.interval + b.timeout + 2*b.cycle)
	to := from.Add(b.interval)
	eventually(t, 30*time.Second, "the interval counted", func() bool { return time.Now().After(to) })
	mu.Lock()
	got := 0
	for _, at := range probes {
		if !at.Before(from) && at.Before(to) {
			got++
		}
	}
	mu.Unlock()
	share := len(lone.Held())
	t.Logf("back %v after it went local; in the interval from %v after its return: %d probes, holding %d of %d targets", back.Sub(local).Round(time.Millisecond), from.Sub(back).Round(time.Millisecond), got, share, n)
	if limit := share*13/10 + 2; got > limit || share == 0 || share == n {
		t.Errorf("%d probes in an interval from %v after its return, holding %d of %d targets (at most %d): it still probes the others' targets", got, from.Sub(back).Round(time.Millisecond), share, n, limit)
	}
}
