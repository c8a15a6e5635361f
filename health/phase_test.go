package health

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// Phases deal keys evenly over the grid, the same whatever their order,
// and a key added moves the others' by a grid step at most. A target's
// next tick after a probe is never later than an interval on, and never
// sooner than a grid step; on its phase it stays an interval on; an idle
// tick lands on the phase point nearest to when it falls due.
func TestPhaseTicks(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, interval := range []time.Duration{400 * time.Millisecond, 2 * time.Second, 10 * time.Second} {
		grid := PhaseGrid(interval)
		steps := int(interval / grid)
		for _, n := range []int{1, 37, 1000, 10000} {
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("c%d/n%d", i/3, i%3)
			}
			ph := Phases(keys, interval)
			per := make([]int, steps)
			for _, p := range ph {
				if p%grid != 0 || p < 0 || p >= interval {
					t.Fatalf("interval %v: phase %v off the grid of %v", interval, p, grid)
				}
				per[p/grid]++
			}
			if lo, hi := slices.Min(per), slices.Max(per); n >= steps && hi-lo > 1 {
				t.Errorf("interval %v, %d keys: %d to %d at a point of the grid, want them dealt evenly", interval, n, lo, hi)
			}
			shuffled := slices.Clone(keys)
			rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
			if again := Phases(shuffled, interval); !maps.Equal(again, ph) {
				t.Errorf("interval %v, %d keys: other phases from the same keys in another order", interval, n)
			}
			added := Phases(append(slices.Clone(keys), "c-new/n0"), interval)
			// A grid step at most, or an interval / keys when there are
			// fewer keys than points (the wrap of the interval aside).
			most := max(grid, interval/time.Duration(n)+grid)
			if n >= steps {
				most = grid
			}
			for k, p := range ph {
				d := (added[k] - p + interval) % interval
				if d > interval/2 {
					d = interval - d
				}
				if d > most {
					t.Fatalf("interval %v, %d keys: one key added moved %s by %v", interval, n, k, d)
				}
			}
		}
		for range 2000 {
			phase := time.Duration(rng.IntN(steps)) * grid
			at := time.Unix(1_700_000_000, 0).Add(time.Duration(rng.Int64N(int64(time.Hour))))
			next := NextProbe(phase, at, interval)
			if next.After(at) || !next.After(at.Add(-interval+grid-1)) {
				t.Fatalf("interval %v, phase %v: NextProbe(%v) = %v, want within (at - interval + grid, at]", interval, phase, at, next)
			}
			if off := offPhase(phase, next, interval); off >= grid && off <= interval-grid {
				t.Fatalf("interval %v, phase %v: NextProbe gives %v, %v off its phase", interval, phase, next, off)
			}
			onPhase := next.Add(-offPhase(phase, next, interval))
			if got := NextProbe(phase, onPhase.Add(interval), interval); !got.Equal(onPhase.Add(interval)) {
				t.Fatalf("interval %v, phase %v: on its phase at %v, the next tick is %v, want an interval on", interval, phase, onPhase, got)
			}
			idle := NextIdle(phase, at, interval)
			if d := idle.Sub(at); d < -interval/2 || d > interval/2 || offPhase(phase, idle, interval) != 0 {
				t.Fatalf("interval %v, phase %v: NextIdle(%v) = %v: not the nearest point of its phase", interval, phase, at, idle)
			}
		}
	}
}

// Targets taken up together (a fleet instance that takes many leases at
// once, probing each at once) are probed at their own phases from the next
// probe on: their probes spread over the Interval instead of coming
// together every Interval after, and none waits longer than an Interval.
func TestTakenTargetsSpreadToTheirPhases(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			n        = 200
			interval = time.Second
			bucket   = 100 * time.Millisecond
		)
		r := startBubble(t, n, 0, Config{Check: CheckTCP, Interval: interval, Timeout: 100 * time.Millisecond, Rise: 1, Fall: 1},
			func(i int) string { return fmt.Sprintf("c%d/n%d", i/2, i%2) })
		c, ts := r.c, r.ts
		ph := phasesOf(ts, interval)
		// Nothing probed for three intervals; then every target is taken
		// and probed at once.
		time.Sleep(3*interval + 330*time.Millisecond)
		r.sh.local.Store(true)
		took := time.Now()
		for _, tg := range ts {
			c.ProbeNow(tg.Key)
		}
		time.Sleep(4 * interval)
		r.stop()

		r.mu.Lock()
		defer r.mu.Unlock()
		counts := make([]int, int(2*interval/bucket))
		from := took.Add(2 * interval)
		for i, ps := range r.probes {
			if len(ps) == 0 || !ps[0].Equal(took) {
				t.Fatalf("%s: first probe %v, want at once when taken (%v)", ts[i].Key, ps, took)
			}
			for j, p := range ps {
				if j > 0 {
					if gap := p.Sub(ps[j-1]); gap > interval {
						t.Errorf("%s: %v between two probes, over the interval", ts[i].Key, gap)
					}
					// Within a grid step of it counts as on it.
					if off := offPhase(ph[ts[i].Key], p, interval); off >= PhaseGrid(interval) && off <= interval-PhaseGrid(interval) {
						t.Errorf("%s: probe %d at %v, %v off its phase", ts[i].Key, j, p, off)
					}
				}
				if !p.Before(from) && p.Before(from.Add(2*interval)) {
					counts[p.Sub(from)/bucket]++
				}
			}
		}
		mean := float64(2*n) / float64(len(counts))
		t.Logf("%d targets taken at once: from two intervals on, %v probes per %v (mean %.0f)", n, counts, bucket, mean)
		if most := slices.Max(counts); float64(most) > 1.5*mean {
			t.Errorf("up to %d probes in %v, over 1.5 x the mean %.0f: the targets taken together are still probed together", most, bucket, mean)
		}
	})
}

// A target whose probe waits for the budget, moved to its phase, leaves the
// queue and is probed at the next point of its phase, not when the budget
// frees up.
func TestProbeAtPhase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			n        = 100
			interval = time.Second
		)
		r := startBubble(t, n, n, Config{Check: CheckTCP, Interval: interval, Timeout: 100 * time.Millisecond, Rise: 1, Fall: 1,
			ProbeBudget: 20}, func(i int) string { return fmt.Sprintf("c/n%d", i) })
		c, ts := r.c, r.ts
		// 100 targets a second against a budget of 20: most wait.
		time.Sleep(2 * interval)
		synctest.Wait()
		queued := func(i int) bool {
			c.mu.Lock()
			w := c.run.workers[ts[i].Key]
			c.mu.Unlock()
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.queued
		}
		var moved []int
		for i := range n {
			if len(moved) < 10 && queued(i) {
				moved = append(moved, i)
			}
		}
		if len(moved) < 10 {
			t.Fatalf("only %d of %d targets wait for the budget", len(moved), n)
		}
		at := time.Now()
		r.mu.Lock()
		before := make([]int, n)
		for _, i := range moved {
			before[i] = len(r.probes[i])
		}
		r.mu.Unlock()
		// The budget is lifted: every probe still waiting starts at once,
		// but not those moved to their phases.
		for _, i := range moved {
			c.ProbeAtPhase(ts[i].Key)
			if queued(i) {
				t.Fatalf("%s still waits for the budget after ProbeAtPhase", ts[i].Key)
			}
		}
		c.SetProbeBudget(0)
		time.Sleep(interval)
		r.stop()
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, i := range moved {
			if len(r.probes[i]) <= before[i] {
				t.Errorf("%s not probed within an interval of being moved to its phase", ts[i].Key)
				continue
			}
			p := r.probes[i][before[i]]
			if want := NextIdle(phasesOf(ts, interval)[ts[i].Key], at.Add(interval/2), interval); !p.Equal(want) {
				t.Errorf("%s probed at %v after being moved, want its phase at %v", ts[i].Key, p.Sub(at), want.Sub(at))
			}
		}
	})
}

// phasesOf is the phases of ts's keys (see Phases).
func phasesOf(ts []Target, interval time.Duration) map[string]time.Duration {
	keys := make([]string, len(ts))
	for i, t := range ts {
		keys[i] = t.Key
	}
	return Phases(keys, interval)
}
