package lock

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// modes is an Observer that notes when a coordinator went local, and
// counts its status writes Redis took.
type modes struct {
	mu     sync.Mutex
	locals []time.Time
	backs  []time.Time // back to coordinated mode after local mode
	wrote  atomic.Int64
}

func (m *modes) Leases(int)                {}
func (m *modes) Message(string)            {}
func (m *modes) Resync(error)              {}
func (m *modes) Propagation(time.Duration) {}
func (m *modes) Extend(int, int)           {}
func (m *modes) Write(ok, _ bool) {
	if ok {
		m.wrote.Add(1)
	}
}
func (m *modes) Mode(mode string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch {
	case mode == ModeLocal:
		m.locals = append(m.locals, time.Now())
	case mode == ModeCoordinated && len(m.locals) > len(m.backs):
		m.backs = append(m.backs, time.Now())
	}
}

// cameBack returns when the coordinator last came back from local mode
// (zero if it did not).
func (m *modes) cameBack() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.backs) == 0 {
		return time.Time{}
	}
	return m.backs[len(m.backs)-1]
}

func (m *modes) wentLocal() []time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.locals)
}

// Settings of the outage tests: an interval of a second, so that the
// failure streak local mode waits for (two cycles: a second) is longer
// than the 0.6 s stall.
const (
	outageInterval = time.Second
	outageTimeout  = 500 * time.Millisecond
	outageCycle    = outageInterval / 2
)

// outageFleet is n coordinators with the tcp check of targets on srv,
// clients whose own timeouts let the adaptive deadline govern, each
// observed, given the targets once all are members; failures counts the Redis calls they logged as failed while
// coordinating, probes every probe's start.
type outageFleet struct {
	ins      []*instance
	modes    []*modes
	failures atomic.Int64
	settled  time.Time // every instance held the leases the fleet gives it

	mu     sync.Mutex
	probes []time.Time
}

func startOutageFleet(t *testing.T, srv *redistest.Server, n int, targets []health.Target, interval time.Duration) *outageFleet {
	t.Helper()
	f := &outageFleet{}
	for range n {
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true,
			DialTimeout: MaxCallTimeout, ReadTimeout: MaxCallTimeout, WriteTimeout: MaxCallTimeout})
		t.Cleanup(func() { rdb.Close() })
		m := &modes{}
		f.modes = append(f.modes, m)
		logf := func(format string, args ...any) {
			if strings.Contains(fmt.Sprintf(format, args...), "still coordinating") {
				f.failures.Add(1)
			}
			t.Logf(format, args...)
		}
		f.ins = append(f.ins, startChecked(t, rdb, nil,
			Config{Prefix: "fleet:", Interval: interval, Timeout: outageTimeout, Resync: time.Second, Logf: logf, Observer: m},
			health.Config{Check: health.CheckTCP, Interval: interval, Timeout: outageTimeout, Rise: 1, Fall: 1,
				Observe: func(_, _ string, d time.Duration) {
					f.mu.Lock()
					defer f.mu.Unlock()
					f.probes = append(f.probes, time.Now().Add(-d))
				}}))
	}
	// The targets come once every instance is a member: a lone first
	// instance would take every lease and probe every target at once,
	// aligning all its checker's ticks to that moment.
	eventually(t, 20*time.Second, "every instance a member of the fleet", func() bool {
		for _, in := range f.ins {
			in.coord.mu.Lock()
			m := len(in.coord.memberList)
			in.coord.mu.Unlock()
			if m != n {
				return false
			}
		}
		return true
	})
	for _, in := range f.ins {
		in.coord.SetTargets(targets)
		in.check.SetTargets(targets)
	}
	eventually(t, 20*time.Second, "every instance sees every target up", allState(f.ins, targets, health.Up))
	var tokens []string
	for _, in := range f.ins {
		tokens = append(tokens, in.coord.Token())
	}
	eventually(t, 20*time.Second, "every instance holds the leases the fleet gives it", func() bool {
		for _, in := range f.ins {
			var want []string
			for _, tg := range targets {
				if owner(tokens, tg.Key) == in.coord.Token() {
					want = append(want, tg.Key)
				}
			}
			slices.Sort(want)
			if !slices.Equal(in.coord.Held(), want) {
				return false
			}
		}
		return true
	})
	f.settled = time.Now()
	return f
}

// allIn reports whether every instance of the fleet is in mode m: a
// condition for eventually.
func (f *outageFleet) allIn(m string) func() bool {
	return func() bool {
		for _, in := range f.ins {
			if in.coord.Mode() != m {
				return false
			}
		}
		return true
	}
}

// probesBetween counts the probes started in [from, to) per bucket.
func (f *outageFleet) probesBetween(from, to time.Time, bucket time.Duration) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	counts := make([]int, (to.Sub(from)+bucket-1)/bucket)
	for _, at := range f.probes {
		if !at.Before(from) && at.Before(to) {
			counts[at.Sub(from)/bucket]++
		}
	}
	return counts
}

// probesIn counts the probes started in [from, to).
func (f *outageFleet) probesIn(from, to time.Time) int {
	if !from.Before(to) {
		return 0
	}
	return f.probesBetween(from, to, to.Sub(from))[0]
}

// targetsOn spreads n targets over a few backends (a target is its key:
// several may share an address).
func targetsOn(t *testing.T, n int) []health.Target {
	var backends []*backend
	for range 5 {
		backends = append(backends, newBackend(t))
	}
	var ts []health.Target
	for i := range n {
		ts = append(ts, health.Target{Key: fmt.Sprintf("c%d/n%d", i/3, i%3), Addr: backends[i%len(backends)].addr})
	}
	return ts
}

// One missed deadline is not an outage: Redis paused for 0.6 s (CLIENT
// PAUSE ALL) makes the calls sent at its start miss their deadline, but
// no coordinator goes local (the failures span less than two cycles), and
// each keeps the leases it held. Redis stopped for good puts every one in
// local mode within four cycles and a call's longest deadline: the first
// failed call comes within a cycle, the streak lasts two, and the
// heartbeat that ends it comes within one more.
func TestCoordinatorOutageStreak(t *testing.T) {
	srv := redistest.Start(t)
	targets := targetsOn(t, 60)
	f := startOutageFleet(t, srv, 3, targets, outageInterval)
	held := make([][]string, len(f.ins))
	for i, in := range f.ins {
		held[i] = in.coord.Held()
	}

	const pause = 600 * time.Millisecond
	admin := srv.Client(t)
	paused := time.Now()
	if err := admin.Do(context.Background(), "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	// A measurement window: every call sent during the pause has ended
	// (answered or out of time), and every coordinator has heartbeaten
	// since.
	time.Sleep(pause + MaxCallTimeout + 2*outageCycle)
	t.Logf("Redis paused %v: %d Redis calls failed and were ridden out", pause, f.failures.Load())
	for i, m := range f.modes {
		if l := m.wentLocal(); len(l) > 0 {
			t.Errorf("instance %d went local %v after a %v pause began", i, l[0].Sub(paused).Round(time.Millisecond), pause)
		}
		if got := f.ins[i].coord.Held(); !slices.Equal(got, held[i]) {
			t.Errorf("instance %d holds %d leases after the pause, %d before: the pause moved leases", i, len(got), len(held[i]))
		}
	}

	stopped := time.Now() // calls fail from when Stop begins
	srv.Stop()
	bound := 4*outageCycle + MaxCallTimeout
	eventually(t, bound+5*time.Second, "every instance local with Redis stopped", f.allIn(ModeLocal))
	for i, m := range f.modes {
		l := m.wentLocal()
		took := l[0].Sub(stopped)
		t.Logf("Redis stopped: instance %d local after %v (bound %v)", i, took.Round(time.Millisecond), bound)
		// A streak begins with the first failed call's start, and a call
		// in flight when Redis stopped began before: half a cycle of
		// slack for it on a loaded machine (going local at the first
		// failure would take a few milliseconds).
		if took < 2*outageCycle-outageCycle/2 {
			t.Errorf("instance %d went local %v after Redis stopped, before two cycles (%v) of failures", i, took, 2*outageCycle)
		}
		if took > bound+time.Second {
			t.Errorf("instance %d went local %v after Redis stopped, want within %v", i, took, bound)
		}
	}
}

// Going local does not probe everything at once, nor everything from the
// start: 3 coordinators × 500 targets, interval 2 s, Redis stopped. The
// targets each instance held keep their ticks. The others' targets stay
// with the statuses their holders last wrote for a lease less an interval
// after their last heartbeat read here, before Redis stopped (and no
// longer: the fleet's bound for a node that stops): until then the fleet
// probes no more than it did coordinated, so that instances that miss
// Redis's deadlines for a few seconds (a Redis starved of CPU by the fleet
// it serves) do not starve it further by probing everything. Checked: the
// probes started in that time stay within the coordinated fleet's rate
// (its last interval before the stop, and a tenth more). Then each target
// is first probed here at its own tick, so the probes started in any
// 200 ms window stay under the coordinated fleet's busiest 200 ms plus
// twice the newly local probes' average ((N-1)/N of N × M per interval:
// 100 per 200 ms), where kicking every target at once put one instance's
// (N-1)/N × 500 = 333 probes into a window. The window is two 100 ms
// buckets wide, sliding by one: the held targets' ticks come in a burst
// that a bucket boundary may split one way before Redis stopped and
// another way after, and a window of two holds the burst whole either
// way. Within an interval of the covers lapsing, every instance probes
// every target.
func TestCoordinatorLocalProbeRamp(t *testing.T) {
	const n, bucket, interval = 500, 100 * time.Millisecond, 2 * time.Second
	srv := redistest.Start(t)
	targets := targetsOn(t, n)
	f := startOutageFleet(t, srv, 3, targets, interval)
	eventually(t, 20*time.Second, "an interval with one prober per target", func() bool {
		now := time.Now()
		return time.Since(f.settled) > interval && f.probesIn(now.Add(-interval), now) <= n*11/10
	})

	// Leases that moved after the targets came (an instance that went
	// local under load and came back) leave the checkers' ticks of the
	// targets they moved aligned to the take, and what follows measures
	// those, not going local.
	for i, m := range f.modes {
		if l := m.wentLocal(); len(l) > 0 {
			t.Skipf("instance %d went local before Redis stopped (a loaded machine): the ticks are not spread, nothing to measure", i)
		}
	}
	stopped := time.Now() // calls fail from when Stop begins
	srv.Stop()
	gone := time.Now() // and may still be answered until it ends
	eventually(t, 10*time.Second, "every instance local with Redis stopped", f.allIn(ModeLocal))
	// The covers lapse a lease less an interval after the last heartbeat
	// each instance read before the stop: from covered (the first to lapse)
	// to lapsed (the last), on this host's clock.
	b, _ := f.ins[0].coord.cfg.bounds()
	var covered, lapsed time.Time
	for i, in := range f.ins {
		in.coord.mu.Lock()
		nc := len(in.coord.localCover)
		for _, lc := range in.coord.localCover {
			at := time.UnixMicro(lc.until).Add(-in.coord.offset)
			if at.After(lapsed) {
				lapsed = at
			}
			if covered.IsZero() || at.Before(covered) {
				covered = at
			}
		}
		in.coord.mu.Unlock()
		t.Logf("instance %d: %d targets left to their holders' statuses", i, nc)
		if want := n * (len(f.ins) - 1) / len(f.ins) * 8 / 10; nc < want {
			t.Errorf("instance %d leaves %d targets to their holders' statuses, want about %d (the others' share)", i, nc, n*(len(f.ins)-1)/len(f.ins))
		}
	}
	if min := stopped.Add(b.localCover() - b.cycle - MaxCallTimeout); covered.Before(min) {
		t.Errorf("a cover lapsed %v after Redis stopped, before %v after the last heartbeat read", covered.Sub(stopped), b.localCover())
	}
	// Redis's clock is known here within a heartbeat's round trip, which
	// a loaded machine stretches: a tenth of a second allowed for it, far
	// short of the member TTL's extra second.
	if max := gone.Add(b.localCover() + 100*time.Millisecond); lapsed.After(max) {
		t.Errorf("a cover lapsed %v after Redis stopped (%v after it was gone), after %v: a node stopped with Redis would stay in the answers past the fleet's bound", lapsed.Sub(stopped), lapsed.Sub(gone), b.localCover())
	}
	// No target left to its holder's status is probed here while its
	// cover lasts: goLocal dropped this instance's own verdicts of those,
	// and a probe records one. Looked at every 10 ms until the last cover
	// lapses.
	probed := make([]int, len(f.ins))
	for time.Now().Before(lapsed) {
		for i, in := range f.ins {
			in.coord.mu.Lock()
			n := 0
			for k, lc := range in.coord.localCover {
				if _, ok := in.coord.own[k]; ok && lc.until > in.coord.now() {
					n++
				}
			}
			in.coord.mu.Unlock()
			probed[i] = max(probed[i], n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for i, n := range probed {
		if n > 0 {
			t.Errorf("instance %d probed %d targets that their holders' statuses still covered", i, n)
		}
	}
	end := lapsed.Add(2 * interval)
	eventually(t, 30*time.Second, "two intervals after the covers lapsed", func() bool { return time.Now().After(end.Add(outageTimeout)) })

	steady := f.probesBetween(stopped.Add(-interval), stopped, bucket)
	steadySum := f.probesIn(stopped.Add(-interval), stopped)
	heldSum := f.probesIn(stopped, covered)
	heldWant := steadySum * int(covered.Sub(stopped)) / int(interval) * 11 / 10
	t.Logf("probe starts in the %v after Redis stopped, while the holders' statuses cover their targets: %d (coordinated: %d an interval, so at most %d)",
		covered.Sub(stopped).Round(time.Millisecond), heldSum, steadySum, heldWant)
	if heldSum > heldWant {
		t.Errorf("%d probe starts in the %v after Redis stopped, over the coordinated fleet's %d: the others' targets were probed while their holders' statuses covered them",
			heldSum, covered.Sub(stopped).Round(time.Millisecond), heldWant)
	}

	counts := f.probesBetween(stopped, end, bucket)
	perWindow := func(probers int) int { return probers * n * int(2*bucket) / int(interval) }
	limit := slices.Max(windows2(steady)) + 2*(perWindow(len(f.ins))-perWindow(1))
	t.Logf("probe starts per %v, coordinated (the interval before Redis stopped; %d at one probe per target per interval): %v", bucket, perWindow(1)/2, steady)
	t.Logf("probe starts per %v from Redis stopped (covers lapsed after %v; %d when every instance probes every target): %v",
		bucket, lapsed.Sub(stopped).Round(time.Millisecond), perWindow(len(f.ins))/2, counts)
	peak := slices.Max(windows2(counts))
	t.Logf("peak %d per %v, limit %d", peak, 2*bucket, limit)
	if peak > limit {
		t.Errorf("a burst of %d probe starts in %v after Redis stopped, over %d", peak, 2*bucket, limit)
	}
	lastInterval := 0
	for _, c := range counts[len(counts)-int(interval/bucket):] {
		lastInterval += c
	}
	if want := len(f.ins) * n * 8 / 10; lastInterval < want {
		t.Errorf("%d probes in the last interval, want about %d (every instance probing every target)", lastInterval, len(f.ins)*n)
	}
}

// windows2 sums each two neighbouring buckets: the counts of a window two
// buckets wide, sliding by one.
func windows2(counts []int) []int {
	if len(counts) < 2 {
		return slices.Clone(counts)
	}
	w := make([]int, len(counts)-1)
	for i := range w {
		w[i] = counts[i] + counts[i+1]
	}
	return w
}

// A frozen Redis holds up the statuses, not the probes: the instance that
// holds a target keeps probing it at its interval while its writes wait
// for Redis, so that its own answers follow the node until the fleet goes
// local. Before, the probe loop waited for each write: a Redis frozen
// (SIGSTOP) held the next probe for a whole call deadline (CallTimeout
// at least), the first probe after the freeze and at most one more within
// it.
func TestCoordinatorProbesThroughFrozenRedis(t *testing.T) {
	const interval = 50 * time.Millisecond
	srv := redistest.Start(t)
	b := newBackend(t)
	tg := health.Target{Key: "c/n0", Addr: b.addr}
	var mu sync.Mutex
	var probes []time.Time
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true,
		DialTimeout: MaxCallTimeout, ReadTimeout: MaxCallTimeout, WriteTimeout: MaxCallTimeout})
	t.Cleanup(func() { rdb.Close() })
	in := startChecked(t, rdb, []health.Target{tg},
		Config{Prefix: "frozen:", Interval: interval, Timeout: outageTimeout, Resync: time.Second, Logf: t.Logf},
		health.Config{Check: health.CheckTCP, Interval: interval, Timeout: outageTimeout, Rise: 1, Fall: 1,
			Observe: func(_, _ string, d time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				probes = append(probes, time.Now().Add(-d))
			}})
	eventually(t, 20*time.Second, "the instance holds the target's lease and sees it up", func() bool {
		return slices.Equal(in.coord.Held(), []string{tg.Key}) && in.state(tg.Key) == health.Up
	})
	frozen := time.Now()
	if err := srv.Freeze(); err != nil {
		t.Fatal(err)
	}
	window := CallTimeout - interval/2 // before the first write could have failed
	eventually(t, 10*time.Second, "the window after the freeze has passed", func() bool { return time.Since(frozen) > window })
	mu.Lock()
	n := 0
	for _, at := range probes {
		if !at.Before(frozen) && at.Before(frozen.Add(window)) {
			n++
		}
	}
	mu.Unlock()
	t.Logf("probes of the held target in the %v after Redis froze: %d (interval %v)", window, n, interval)
	if n < 3 {
		t.Errorf("%d probes of the held target in the %v after Redis froze, want about %d: the probes waited for Redis", n, window, int(window/interval))
	}
	if err := srv.Thaw(); err != nil {
		t.Fatal(err)
	}
}
