package lock

import (
	"container/heap"
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// simSlot is the resolution of a simulated checker's timer wheel: a
// target's tick runs within simSlot of when it falls due.
const simSlot = 10 * time.Millisecond

// simChecker does for one instance of the scale benchmark what
// health.Checker does with its Shared, without connections: each target
// ticks every interval from a random offset (the checker's first tick),
// asks Claim whether to probe, and when it does, "probes" by reading the
// backend's simulated state, applies rise and fall, and hands the progress
// to Record, in a goroutine of its own as the checker's ticks do (Record
// writes to Redis while this instance holds the lease, and must not hold
// up the other targets' ticks while Redis stalls). ProbeNow ticks a target
// at once, or right after the tick in flight.
//
// The checker keeps a timer per target; here one goroutine per instance
// runs a wheel of simSlot slots, so that 300 instances × 10,000 targets
// cost the harness a few wake-ups per slot rather than 3 million timers,
// and what the process spends is mostly what the coordinators spend.
type simChecker struct {
	fl       *scaleFleet
	shared   health.Shared
	interval time.Duration
	rise     uint8
	fall     uint8

	mu     sync.Mutex
	ts     []simTarget  // by the fleet's target index
	slots  [][]simEntry // slot (due / simSlot) % len(slots)
	now    []simEntry   // ticks due at once (ProbeNow, a late reschedule)
	cursor int64        // the last slot number run
	batch  []int32      // the ticks taken off the wheel, run outside mu
	late   int64        // the most a tick ran after it fell due, ns (see lateness)
	wake   chan struct{}

	// The probe budget, as health's: a token bucket of one token, and the
	// probes waiting for a token, by key.
	rate   float64 // probes a second; 0: none
	tokens float64
	at     int64 // Unix ns: tokens as of then
	queue  simQueue
}

// simEntry is a target's place on the wheel; it counts while seq is the
// target's (ProbeNow moves a target by bumping its seq).
type simEntry struct {
	idx int32
	seq uint32
}

// simTarget is what a simulated checker keeps per target: its tick, and
// its tracker (the health package's, reduced to what a tcp check uses).
type simTarget struct {
	due     int64 // Unix ns of the next tick, while on the wheel
	seq     uint32
	busy    bool // off the wheel: its tick runs
	again   bool // ProbeNow came while busy: tick again at once
	probing bool // the last tick probed
	parked  bool // due beyond the next interval, by ClaimParked (see health.Parking)
	state   health.State
	ok      uint8 // consecutive successes, at most rise
	fail    uint8 // consecutive failures, at most fall
	last    int64 // Unix ns of the last probe
}

func newSimChecker(fl *scaleFleet, shared health.Shared) *simChecker {
	n := int(2*fl.interval/simSlot) + 2
	c := &simChecker{fl: fl, shared: shared, interval: fl.interval, rise: fl.rise, fall: fl.fall,
		slots: make([][]simEntry, n), wake: make(chan struct{}, 1), rate: fl.budget, at: time.Now().UnixNano()}
	c.tokens = c.burst()
	return c
}

// setTargets starts every target of the fleet, each first ticking at a
// random point of the next interval, as the checker's SetTargets does.
func (c *simChecker) setTargets() {
	now := time.Now().UnixNano()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ts = make([]simTarget, len(c.fl.targets))
	for i := range c.ts {
		c.ts[i].due = now + int64(rand.N(c.interval))
		c.schedule(int32(i))
	}
}

// schedule puts target i on the wheel at its due time, or on the list of
// ticks due at once when that slot has run. c.mu is held.
func (c *simChecker) schedule(i int32) {
	t := &c.ts[i]
	t.seq++
	e := simEntry{idx: i, seq: t.seq}
	s := t.due / int64(simSlot)
	if s <= c.cursor {
		c.now = append(c.now, e)
		c.signal()
		return
	}
	c.slots[s%int64(len(c.slots))] = append(c.slots[s%int64(len(c.slots))], e)
}

func (c *simChecker) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// ProbeNow is the checker's ProbeNow.
func (c *simChecker) ProbeNow(key string) {
	i, ok := c.fl.index[key]
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ts == nil {
		return
	}
	t := &c.ts[i]
	if t.busy {
		t.again = true
		return
	}
	t.due = time.Now().UnixNano()
	t.parked = false
	t.seq++
	c.now = append(c.now, simEntry{idx: i, seq: t.seq})
	c.signal()
}

// ProbeAtPhase is the checker's ProbeAtPhase.
func (c *simChecker) ProbeAtPhase(key string) {
	i, ok := c.fl.index[key]
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	q := slices.IndexFunc(c.queue, func(w simWait) bool { return w.idx == i })
	if q < 0 {
		return
	}
	heap.Remove(&c.queue, q)
	t := &c.ts[i]
	t.busy = false
	now := time.Now()
	t.due = health.NextIdle(c.fl.phases[i], now.Add(c.interval/2), c.interval).UnixNano()
	c.schedule(i)
}

// run ticks the targets until ctx is done.
func (c *simChecker) run(ctx context.Context) {
	c.mu.Lock()
	c.cursor = time.Now().UnixNano() / int64(simSlot)
	c.mu.Unlock()
	t := time.NewTicker(simSlot)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-c.wake:
		}
		c.runDue(ctx)
	}
}

// runDue runs every tick that is due.
func (c *simChecker) runDue(ctx context.Context) {
	now := time.Now().UnixNano()
	c.mu.Lock()
	batch := c.batch[:0]
	take := func(e simEntry) {
		if t := &c.ts[e.idx]; !t.busy && t.seq == e.seq {
			t.busy = true
			c.late = max(c.late, now-t.due)
			batch = append(batch, e.idx)
		}
	}
	for _, e := range c.now {
		take(e)
	}
	c.now = c.now[:0]
	last := now / int64(simSlot)
	for s := c.cursor + 1; s <= last; s++ {
		slot := c.slots[s%int64(len(c.slots))]
		kept := slot[:0]
		for _, e := range slot {
			if c.ts[e.idx].seq == e.seq && c.ts[e.idx].due/int64(simSlot) > s {
				kept = append(kept, e) // a later turn of the wheel
				continue
			}
			take(e)
		}
		c.slots[s%int64(len(c.slots))] = kept
	}
	c.cursor = max(c.cursor, last)
	c.batch = batch
	c.mu.Unlock()
	for _, i := range batch {
		if ctx.Err() != nil {
			return
		}
		c.tick(i, now)
	}
	c.dispatch(ctx)
}

// lateness returns the most a tick ran after it fell due since the last
// call: how long this process kept the wheel from running (a starved
// process, or a Claim that waited for its coordinator's lock).
func (c *simChecker) lateness() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.late
	c.late = 0
	return time.Duration(l)
}

// tick is the checker's tick of target i at now: Claim, and when this
// instance probes it, the probe and Record in a goroutine.
func (c *simChecker) tick(i int32, now int64) {
	t := &c.ts[i]
	// The tick's start: when it fell due, unless the wheel ran it late
	// (a goroutine held up), as the checker's timer would have.
	start := t.due
	if now-start > int64(simSlot) {
		start = now
	}
	tg := c.fl.targets[i]
	var probe bool
	var seed health.Progress
	var until time.Time
	if p, ok := c.shared.(health.Parking); ok {
		probe, seed, until = p.ClaimParked(tg)
	} else {
		probe, seed = c.shared.Claim(tg)
	}
	if !probe {
		t.probing = false
		c.idle(i, start, until)
		return
	}

	continuing := t.probing
	if !continuing && (seed.Verdict.State != health.Unknown || seed.OK != 0 || seed.Fail != 0) {
		t.state = seed.Verdict.State
		t.ok = uint8(min(max(seed.OK, 0), int(c.rise)))
		t.fail = uint8(min(max(seed.Fail, 0), int(c.fall)))
	}
	t.probing = true
	// When the budget is short, the probes due longest ago go first, a
	// target probed at its last tick an interval ahead (the checker's
	// order).
	key := now
	if continuing {
		key -= int64(c.interval)
	}
	if c.admit(i, key, now) {
		c.check(i, start)
	}
}

// check probes target i, its probe started at start, in a goroutine of
// its own: the result, rise and fall, Record, and the next tick.
func (c *simChecker) check(i int32, start int64) {
	t, tg := &c.ts[i], c.fl.targets[i]
	c.fl.probed(i, start)
	go func() {
		c.record(t, !c.fl.down[i].Load(), start)
		c.shared.Record(tg, c.progress(t))
		c.next(i, start)
	}()
}

// burst is the most tokens the budget holds: health's one token.
func (c *simChecker) burst() float64 { return 1 }

// refill adds the tokens earned since c.at. c.mu is held. health's budget
// starts a waiting probe when each token comes; here the wheel draws on
// the budget once a slot, so that while probes wait, the tokens of the
// last slot (and one) are kept for them: the rate is health's, at the
// wheel's resolution.
func (c *simChecker) refill(now int64) {
	if c.rate > 0 {
		c.tokens = min(c.most(), c.tokens+float64(now-c.at)/1e9*c.rate)
	}
	c.at = now
}

// most is how many tokens the budget keeps now (see refill). c.mu is held.
func (c *simChecker) most() float64 {
	if len(c.queue) > 0 {
		return c.burst() + c.rate*simSlot.Seconds()
	}
	return c.burst()
}

// admit reports whether target i's probe may start now, taking a token;
// otherwise it waits in the queue under key until dispatch starts it.
func (c *simChecker) admit(i int32, key, now int64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.rate == 0 && len(c.queue) == 0 {
		return true
	}
	c.refill(now)
	if len(c.queue) == 0 && c.tokens >= 1 {
		c.tokens--
		return true
	}
	heap.Push(&c.queue, simWait{idx: i, key: key, queuedAt: now})
	return false
}

// dispatch starts the waiting probes whose turn came, in the queue's
// order: each only if Claim still gives the target to this instance (a
// turn not used goes to the next), as the checker's budget does.
func (c *simChecker) dispatch(ctx context.Context) {
	for ctx.Err() == nil {
		now := time.Now().UnixNano()
		c.mu.Lock()
		c.refill(now)
		if len(c.queue) == 0 || c.rate > 0 && c.tokens < 1 {
			c.mu.Unlock()
			return
		}
		w := heap.Pop(&c.queue).(simWait)
		spent := c.rate > 0
		start := now
		if spent {
			c.tokens--
			// health's budget would have started it when its token
			// came: the tokens left came after it, one every 1/rate.
			start = max(w.queuedAt, now-int64(c.tokens/c.rate*float64(time.Second)))
		}
		c.mu.Unlock()
		c.fl.waited(time.Duration(now - w.queuedAt))
		if probe, _ := c.shared.Claim(c.fl.targets[w.idx]); !probe {
			c.ts[w.idx].probing = false
			c.idle(w.idx, now, time.Time{})
			if spent {
				c.mu.Lock()
				c.tokens = min(c.most(), c.tokens+1)
				c.mu.Unlock()
			}
			continue
		}
		c.check(w.idx, start)
	}
}

// simWait is a probe waiting for the budget.
type simWait struct {
	idx      int32
	key      int64 // Unix ns: earlier goes first
	queuedAt int64
}

// simQueue is the budget's queue: a heap by key, then by the time the
// probes came.
type simQueue []simWait

func (q simQueue) Len() int { return len(q) }
func (q simQueue) Less(i, j int) bool {
	if q[i].key != q[j].key {
		return q[i].key < q[j].key
	}
	return q[i].queuedAt < q[j].queuedAt
}
func (q simQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *simQueue) Push(x any)   { *q = append(*q, x.(simWait)) }
func (q *simQueue) Pop() any {
	old := *q
	w := old[len(old)-1]
	*q = old[:len(old)-1]
	return w
}

// next puts target i back on the wheel after a probe that started at
// start, when the checker's next tick would be (health.NextProbe), or at
// once when ProbeNow came meanwhile.
func (c *simChecker) next(i int32, start int64) {
	c.reschedule(i, health.NextProbe(c.fl.phases[i], time.Unix(0, start+int64(c.interval)), c.interval).UnixNano())
}

// idle puts target i back on the wheel after a tick at at that did not
// probe it, when the checker's next tick would be (health.NextSkipped:
// parked until a time Shared gave, or an interval on), or at once when
// ProbeNow came meanwhile.
func (c *simChecker) idle(i int32, at int64, until time.Time) {
	next, parked := health.NextSkipped(c.fl.phases[i], time.Unix(0, at), until, c.interval)
	c.rescheduleParked(i, next.UnixNano(), parked)
}

// reschedule puts target i back on the wheel at due, or at once when
// ProbeNow came meanwhile.
func (c *simChecker) reschedule(i int32, due int64) { c.rescheduleParked(i, due, false) }

func (c *simChecker) rescheduleParked(i int32, due int64, parked bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &c.ts[i]
	t.busy = false
	t.due = due
	t.parked = parked
	if t.again {
		t.again, t.parked = false, false
		t.due = time.Now().UnixNano()
	}
	c.schedule(i)
}

// Recheck is the checker's Recheck.
func (c *simChecker) Recheck(key string) {
	i, ok := c.fl.index[key]
	if !ok {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recheck(i, time.Now())
}

// RecheckAll is the checker's RecheckAll.
func (c *simChecker) RecheckAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for i := range c.ts {
		c.recheck(int32(i), now)
	}
}

// recheck brings target i, if parked, back to the next point of its
// phase. c.mu is held.
func (c *simChecker) recheck(i int32, now time.Time) {
	if c.ts == nil {
		return
	}
	t := &c.ts[i]
	if !t.parked || t.busy {
		return
	}
	t.parked = false
	t.due = health.NextIdle(c.fl.phases[i], now.Add(c.interval/2), c.interval).UnixNano()
	c.schedule(i)
}

// record applies rise and fall to a probe that found the backend up or
// not, as the health package's tracker does.
func (c *simChecker) record(t *simTarget, up bool, at int64) {
	t.last = at
	if up {
		t.ok, t.fail = min(t.ok+1, c.rise), 0
		if t.ok >= c.rise {
			t.state = health.Up
		}
		return
	}
	t.fail, t.ok = min(t.fail+1, c.fall), 0
	if t.fail >= c.fall {
		t.state = health.Down
	}
}

// progress is a target's Progress, as the checker hands it to Record: a
// refused connect is what a stopped tcp backend makes.
func (c *simChecker) progress(t *simTarget) health.Progress {
	v := health.Verdict{State: t.state, Last: time.Unix(0, t.last)}
	switch t.state {
	case health.Up:
		v.Cause = health.CauseOK
	case health.Down:
		v.Cause, v.Detail = health.CauseRefused, "connect: connection refused"
	}
	return health.Progress{Verdict: v, OK: int(t.ok), Fail: int(t.fail)}
}
