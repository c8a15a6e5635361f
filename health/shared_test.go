package health

import (
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// sharing is a Shared that probes while mine is set, seeding from seed, and
// keeps what it is told.
type sharing struct {
	mu       sync.Mutex
	mine     bool
	seed     Progress
	claims   int
	recorded []Progress
}

func (s *sharing) Claim(Target) (bool, Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claims++
	return s.mine, s.seed
}

func (s *sharing) Record(_ Target, p Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recorded = append(s.recorded, p)
}

func (s *sharing) set(mine bool, seed Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mine, s.seed = mine, seed
}

func (s *sharing) counts() (claims, records int, last Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.recorded); n > 0 {
		last = s.recorded[n-1]
	}
	return s.claims, len(s.recorded), last
}

// With Shared, a target that is not claimed is not probed (not one
// connection reaches it); claimed, it continues from the seed, so one
// success completes a rise the seed had two thirds of; every probe's
// progress is recorded, its counters bounded by rise and fall; ProbeNow
// probes at once instead of at the next tick.
func TestSharedClaimSeedRecord(t *testing.T) {
	const interval = 100 * time.Millisecond
	sh := &sharing{}
	c := mustNew(t, Config{Check: CheckTCP, Interval: interval, Timeout: 50 * time.Millisecond, Rise: 3, Fall: 2, Shared: sh})
	srv := listenReply(t, "127.0.0.1:0", []byte{})
	c.SetTargets([]Target{{Key: "c/a", Addr: srv.addr}})
	start(t, c, 0)

	// Not ours: claimed several times, never probed.
	if err := pgtest.WaitFor(3*time.Second, func() error {
		if n, _, _ := sh.counts(); n < 4 {
			return fmt.Errorf("%d claims", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := srv.accepted.Load(); n != 0 {
		t.Fatalf("%d probes reached a target another checker holds, want 0", n)
	}

	// Ours from a seed two successes into a rise of 3: one probe makes it Up.
	sh.set(true, Progress{OK: 2})
	c.ProbeNow("c/a")
	if err := pgtest.WaitFor(3*time.Second, func() error {
		if _, n, _ := sh.counts(); n < 1 {
			return fmt.Errorf("no probe recorded")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, _, p := sh.counts()
	if p.Verdict.State != Up || p.OK != 3 || p.Fail != 0 {
		t.Fatalf("first probe after a seed of OK=2 (rise 3): %+v, want Up with OK=3", p)
	}
	// More successes keep OK at rise.
	if err := pgtest.WaitFor(3*time.Second, func() error {
		if _, n, _ := sh.counts(); n < 3 {
			return fmt.Errorf("%d probes recorded", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, p := sh.counts(); p.OK != 3 {
		t.Fatalf("OK after several successes with rise 3: %d, want it bounded at 3", p.OK)
	}
}

// ProbeNow probes a target whose next tick is far off at once.
func TestProbeNow(t *testing.T) {
	c := mustNew(t, Config{Check: CheckTCP, Interval: time.Hour, Timeout: 50 * time.Millisecond, Rise: 1, Fall: 1})
	srv := listenReply(t, "127.0.0.1:0", []byte{})
	c.SetTargets([]Target{{Key: "c/a", Addr: srv.addr}})
	start(t, c, 0)
	// The first tick is at a random point of the hour: ask for it now, and
	// again once it ran (a second ProbeNow must start a second probe).
	for want := int32(1); want <= 2; want++ {
		if err := pgtest.WaitFor(3*time.Second, func() error {
			c.ProbeNow("c/a")
			if n := srv.accepted.Load(); n < want {
				return fmt.Errorf("%d probes, want %d", n, want)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	c.ProbeNow("c/none") // not a target: nothing happens
}

// askLog is a Shared that never probes and notes when each target was
// asked.
type askLog struct {
	mu   sync.Mutex
	asks map[string][]time.Time
}

func (a *askLog) Claim(t Target) (bool, Progress) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asks[t.Key] = append(a.asks[t.Key], time.Now())
	return false, Progress{}
}

func (a *askLog) Record(Target, Progress) {}

// The targets another checker probes are asked about once an Interval
// each, on a grid shared by every target, so that those due together cost
// the process one wake: 200 targets at 400 ms (a grid of 10 ms) are asked
// at about 40 moments an interval, not at 200.
func TestSkippedTicksShareWakes(t *testing.T) {
	const n, interval = 200, 400 * time.Millisecond
	a := &askLog{asks: map[string][]time.Time{}}
	c := mustNew(t, Config{Check: CheckTCP, Interval: interval, Timeout: 100 * time.Millisecond, Rise: 1, Fall: 1, Shared: a})
	var ts []Target
	for i := range n {
		ts = append(ts, Target{Key: fmt.Sprintf("c/n%d", i), Addr: netip.MustParseAddrPort("127.0.0.1:1")})
	}
	c.SetTargets(ts)
	started := time.Now()
	start(t, c, 0)
	// The first tick of each is spread over an interval; from the second
	// on, each is on the grid. Two intervals are counted after that.
	from := started.Add(2 * interval)
	to := from.Add(2 * interval)
	if err := pgtest.WaitFor(10*time.Second, func() error {
		if time.Now().Before(to.Add(interval / 4)) {
			return fmt.Errorf("still counting")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	var all []time.Time
	for k, asks := range a.asks {
		in := 0
		for _, at := range asks {
			if !at.Before(from) && at.Before(to) {
				in++
				all = append(all, at)
			}
		}
		if in < 1 || in > 3 {
			t.Errorf("%s asked %d times in two intervals, want about 2", k, in)
		}
	}
	a.mu.Unlock()
	// A moment is asks less than 2 ms after the one before.
	slices.SortFunc(all, func(x, y time.Time) int { return x.Compare(y) })
	moments := 0
	for i, at := range all {
		if i == 0 || at.Sub(all[i-1]) > 2*time.Millisecond {
			moments++
		}
	}
	t.Logf("%d asks of %d targets in two intervals of %v, at %d moments (grid %v: %d)", len(all), n, interval, moments, PhaseGrid(interval), int(2*interval/PhaseGrid(interval)))
	if limit := 3 * int(interval/PhaseGrid(interval)); moments > limit {
		t.Errorf("asks at %d moments in two intervals, over %d: each target's tick wakes the process on its own", moments, limit)
	}
}

// parkLog is an askLog that parks every target it is asked about until
// the time in until (see Parking).
type parkLog struct {
	askLog
	until atomic.Int64 // Unix ns
}

func (p *parkLog) ClaimParked(t Target) (bool, Progress, time.Time) {
	p.Claim(t)
	return false, Progress{}, time.Unix(0, p.until.Load())
}

func (p *parkLog) asked(key string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.asks[key])
}

// A target Shared parks (another checker covers it until a time) is not
// asked about again every Interval, but at the last point of its phase
// before that time; Recheck brings the next ask back within an Interval,
// and a target not parked ignores it.
func TestParkedTargetAskedWhenItMayChange(t *testing.T) {
	const interval = 200 * time.Millisecond
	p := &parkLog{askLog: askLog{asks: map[string][]time.Time{}}}
	p.until.Store(time.Now().Add(time.Hour).UnixNano())
	c := mustNew(t, Config{Check: CheckTCP, Interval: interval, Timeout: 100 * time.Millisecond, Rise: 1, Fall: 1, Shared: p})
	c.SetTargets([]Target{{Key: "c/a", Addr: netip.MustParseAddrPort("127.0.0.1:1")}})
	start(t, c, 0)
	if err := pgtest.WaitFor(3*time.Second, func() error {
		if n := p.asked("c/a"); n != 1 {
			return fmt.Errorf("asked %d times, want 1", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Parked for an hour: ten intervals pass without an ask. (A wait for
	// nothing to happen has no condition to wait for; the bound is
	// generous: ten ticks would have come by now.)
	time.Sleep(10 * interval)
	if n := p.asked("c/a"); n != 1 {
		t.Fatalf("asked %d times over ten intervals while parked for an hour, want 1", n)
	}
	// Recheck: asked again within an interval; parked again after.
	p.until.Store(time.Now().Add(3 * interval).UnixNano())
	asked := time.Now()
	c.Recheck("c/a")
	if err := pgtest.WaitFor(3*time.Second, func() error {
		if n := p.asked("c/a"); n != 2 {
			return fmt.Errorf("asked %d times since Recheck, want 2", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(asked); took > 2*interval {
		t.Errorf("asked again %v after Recheck, want within an interval (%v)", took, interval)
	}
	// Parked until 3 intervals on: asked again by then, not before the
	// next interval's ask would have come.
	if err := pgtest.WaitFor(3*time.Second, func() error {
		if n := p.asked("c/a"); n != 3 {
			return fmt.Errorf("asked %d times, want 3", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	second, third := p.asks["c/a"][1], p.asks["c/a"][2]
	p.mu.Unlock()
	if gap := third.Sub(second); gap < interval+interval/2 || gap > 4*interval {
		t.Errorf("asked %v after the ask that parked it for 3 intervals, want about 2 to 3 intervals", gap)
	}
	// Not parked (until already past): asked every interval, and
	// Recheck changes nothing.
	p.until.Store(0)
	c.RecheckAll()
	if err := pgtest.WaitFor(3*time.Second, func() error {
		if n := p.asked("c/a"); n < 6 {
			return fmt.Errorf("asked %d times, want 6", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
