package health

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// probeStarts returns when each probe l recorded started, from from to to,
// counted in buckets, and the longest time between two probes of one of
// addrs (the first after from counting from from).
func probeStarts(l *probeLog, addrs []netip.AddrPort, from, to time.Time, bucket time.Duration) (counts []int, gap time.Duration) {
	counts = make([]int, int(to.Sub(from)/bucket)+1)
	for _, a := range addrs {
		last := from
		for _, p := range l.get(a) {
			if p.start.Before(from) || !p.start.Before(to) {
				continue
			}
			counts[p.start.Sub(from)/bucket]++
			gap = max(gap, p.start.Sub(last))
			last = p.start
		}
	}
	return counts, gap
}

// With a budget four times short of what the targets ask for (200 targets
// at an interval of 1 s, 50 probes a second), the probes start at the
// budget's rate in every 100 ms, every target is probed
// in turn, and a stopped backend still leaves within fall x max(interval,
// targets/budget) + timeout.
func TestProbeBudgetLeavesWithinBound(t *testing.T) {
	const (
		n        = 200
		budget   = 50.0
		interval = time.Second
		timeout  = 200 * time.Millisecond
		fall     = 2
		bucket   = 100 * time.Millisecond
		slack    = 3 * time.Second // scheduling on a busy machine, under -race
	)
	var delayed atomic.Int64
	c := mustNew(t, Config{Check: CheckTCP, Interval: interval, Timeout: timeout, Rise: 1, Fall: fall,
		ProbeBudget: budget, ObserveBudget: func(time.Duration) { delayed.Add(1) }})
	var log probeLog
	log.wrap(c)
	srvs := make([]*server, n)
	ts := make([]Target, n)
	addrs := make([]netip.AddrPort, n)
	for i := range srvs {
		srvs[i] = listen(t, "127.0.0.1:0")
		ts[i] = Target{Key: fmt.Sprintf("c/n%d", i), Addr: srvs[i].addr}
		addrs[i] = srvs[i].addr
	}
	c.SetTargets(ts)
	began := time.Now()
	rec, stop := start(t, c, 0)

	cycle := time.Duration(float64(n) / budget * float64(time.Second)) // 4 s
	if err := pgtest.WaitFor(cycle+interval+slack, func() error {
		v, _ := rec.last()
		up := 0
		for _, vd := range v.All() {
			if vd.State == Up {
				up++
			}
		}
		if up != n {
			return fmt.Errorf("%d of %d targets up", up, n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	firstUp := time.Since(began)

	stopped := time.Now()
	srvs[n/2].close()
	rec.waitVerdict(ts[n/2].Key, fall*cycle+timeout+slack+slack, isState(Down, CauseRefused))
	took := time.Since(stopped)
	bound := fall*max(interval, cycle) + timeout
	end := time.Now()
	stop()

	counts, _ := probeStarts(&log, addrs, began, end, bucket)
	_, gap := probeStarts(&log, addrs, began.Add(interval), end, bucket)
	// The budget spaces probes 1/budget apart: a bucket holds its
	// length's worth, rounded up; + 2 for probes' goroutines that start
	// late, bunched by a busy machine.
	limit := int(math.Ceil(budget*bucket.Seconds())) + 2
	peak := slices.Max(counts)
	total := 0
	for _, n := range counts {
		total += n
	}
	rate := float64(total) / end.Sub(began).Seconds()
	t.Logf("%d targets, interval %v, budget %v/s: all up after %v; %d probes in %v (%.1f/s), %d waited for the budget; peak %d per %v (limit %d); longest time between two probes of a target %v (targets/budget %v)",
		n, interval, budget, firstUp.Round(time.Millisecond), total, end.Sub(began).Round(time.Millisecond), rate, delayed.Load(),
		peak, bucket, limit, gap.Round(time.Millisecond), cycle)
	t.Logf("stopped backend down after %v (bound fall x max(interval, targets/budget) + timeout = %v)", took.Round(time.Millisecond), bound)

	if peak > limit {
		t.Errorf("%d probes started within %v, over the budget's %v (limit %d)", peak, bucket, budget*bucket.Seconds(), limit)
	}
	if rate > budget*1.05 {
		t.Errorf("%.1f probes a second over the run, over the budget of %v", rate, budget)
	}
	if delayed.Load() == 0 {
		t.Error("no probe waited for the budget, though the targets ask for four times as many")
	}
	if gap > 2*cycle+slack {
		t.Errorf("a target went %v without a probe, want about targets/budget (%v): targets starve", gap, cycle)
	}
	if took > bound+slack {
		t.Errorf("the stopped backend left after %v, want within fall x max(interval, targets/budget) + timeout = %v (+%v)", took, bound, slack)
	}
}

// SetProbeBudget and Config: a budget is a rate or 0.
func TestProbeBudgetConfig(t *testing.T) {
	for _, bad := range []float64{-1, math.NaN(), math.Inf(1)} {
		if _, err := New(Config{Check: CheckTCP, ProbeBudget: bad}); err == nil {
			t.Errorf("ProbeBudget %v accepted", bad)
		}
	}
	c := mustNew(t, Config{Check: CheckTCP, ProbeBudget: 10})
	c.SetProbeBudget(-5)
	if c.rate != 0 {
		t.Errorf("SetProbeBudget(-5) left a rate of %v, want 0 (no budget)", c.rate)
	}
}

// localShared plays a fleet instance: it holds the targets below held, and
// probes every target while local (Redis lost).
type localShared struct {
	held  int
	local atomic.Bool
	ports map[netip.AddrPort]int
}

func (s *localShared) Claim(t Target) (bool, Progress) {
	return s.local.Load() || s.ports[t.Addr] < s.held, Progress{}
}

func (*localShared) Record(Target, Progress) {}

// The order of a short budget, in a bubble's time with probes that take
// none: an instance holding half of 100 targets (interval 1 s, budget
// 60/s) that starts probing them all keeps its own targets' rhythm while
// the others wait their turn, then probes every target in turn at the
// budget's rate; when it stops probing the others, their waiting turns
// start no probe and go to its own targets; a budget set to 0 starts every
// probe waiting at once.
func TestProbeBudgetOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			n        = 100
			budget   = 60
			interval = time.Second
		)
		cycle := time.Second * n / budget // each target in turn: 1.67 s
		r := startBubble(t, n, n/2, Config{Check: CheckTCP, Interval: interval, Timeout: 100 * time.Millisecond, Rise: 1, Fall: 1,
			ProbeBudget: budget}, func(i int) string { return fmt.Sprintf("c/n%d", i) })
		c, sh := r.c, r.sh
		t0 := time.Now()
		at := func(d time.Duration) time.Time { return t0.Add(d) }
		// gap is the longest time between two probes of targets lo..hi-1
		// from from to to (the first counting from the last before from);
		// first is when the last of them was first probed after from.
		gap := func(lo, hi int, from, to time.Time) (longest time.Duration, first time.Time) {
			r.mu.Lock()
			defer r.mu.Unlock()
			for i := lo; i < hi; i++ {
				last, seen := from, false
				for _, p := range r.probes[i] {
					if p.After(to) {
						break
					}
					if p.Before(from) {
						last = p
						continue
					}
					if !seen {
						seen = true
						first = later(first, p)
					}
					longest = max(longest, p.Sub(last))
					last = p
				}
				if !seen {
					longest = max(longest, to.Sub(last))
					first = to
				}
			}
			return longest, first
		}
		starts := func(lo, hi int, from, to time.Time) (n int) {
			r.mu.Lock()
			defer r.mu.Unlock()
			for i := lo; i < hi; i++ {
				for _, p := range r.probes[i] {
					if !p.Before(from) && p.Before(to) {
						n++
					}
				}
			}
			return n
		}

		time.Sleep(5 * time.Second) // the held half: 50 a second, within the budget
		sh.local.Store(true)
		time.Sleep(10 * time.Second)
		switched := at(5 * time.Second)
		heldGap, _ := gap(0, n/2, switched, switched.Add(interval))
		_, othersFirst := gap(n/2, n, switched, at(15*time.Second))
		steadyGap, _ := gap(0, n, at(10*time.Second), at(15*time.Second))
		steadyRate := float64(starts(0, n, at(10*time.Second), at(15*time.Second))) / 5
		t.Logf("local from 5 s: the held targets' longest gap in the first interval %v; the others all probed by %v after; then every target at most %v apart (targets/budget %v), %.1f probes/s",
			heldGap, othersFirst.Sub(switched), steadyGap, cycle.Round(time.Millisecond), steadyRate)
		// A held target's probe, due at its tick, goes ahead of the
		// others' first ones: 50 of them a second fit in the budget, and
		// wait only for each other (1.03-1.05 s measured; in the order
		// they fell due, without the held ones first, 1.37-1.43 s).
		if heldGap > interval+150*time.Millisecond {
			t.Errorf("a held target waited %v for its probe once all were probed, want its interval (%v): the targets taken up went first", heldGap, interval)
		}
		if limit := 2*interval + cycle; othersFirst.Sub(switched) > limit {
			t.Errorf("the targets taken up were all first probed %v after, want within %v", othersFirst.Sub(switched), limit)
		}
		if limit := cycle + 100*time.Millisecond; steadyGap > limit {
			t.Errorf("a target went %v without a probe, want every target in turn within targets/budget (%v)", steadyGap, limit)
		}
		if steadyRate > budget*1.02 || steadyRate < budget*0.9 {
			t.Errorf("%.1f probes a second, want the budget's %v", steadyRate, budget)
		}

		// The fleet is back: the others' waiting turns start no probe,
		// and the held targets are probed every interval again.
		back := time.Now()
		sh.local.Store(false)
		time.Sleep(5 * time.Second)
		if n := starts(n/2, n, back.Add(time.Millisecond), time.Now()); n != 0 {
			t.Errorf("%d probes of targets given back after the fleet came back", n)
		}
		if g, _ := gap(0, n/2, back.Add(2*time.Second), time.Now()); g > interval+150*time.Millisecond {
			t.Errorf("a held target went %v without a probe after the fleet came back, want its interval", g)
		}

		// Local again, then no budget: every waiting probe starts at once.
		sh.local.Store(true)
		time.Sleep(2 * time.Second)
		c.SetProbeBudget(0)
		synctest.Wait()
		c.mu.Lock()
		waiting := len(c.run.budget.queue)
		c.mu.Unlock()
		if waiting != 0 {
			t.Errorf("%d probes still wait after the budget was set to 0", waiting)
		}
		off := time.Now()
		time.Sleep(3 * time.Second)
		if g, _ := gap(0, n, off.Add(interval), time.Now()); g > interval {
			t.Errorf("a target went %v without a probe with no budget, want its interval", g)
		}
		r.stop()
	})
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
