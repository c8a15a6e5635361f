package health

import (
	"cmp"
	"context"
	"hash/fnv"
	"maps"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgcluster/pgcluster/internal/starve"
)

// coalesce is how long the publisher waits after a first change for more
// changes to publish with it.
const coalesce = 5 * time.Millisecond

// probeFunc runs one probe against addr; ctx carries the Timeout.
type probeFunc func(ctx context.Context, addr netip.AddrPort) result

// Checker checks a set of targets and publishes their verdicts. Make one with
// New. Its methods are safe for concurrent use.
type Checker struct {
	cfg   Config
	probe probeFunc
	// starved reports whether this process was starved of CPU since a
	// probe's start, which makes its timeout seen late; nil:
	// starve.Since (a test sets its own).
	starved func(time.Time) bool

	polls atomic.Int64 // role polls run on the sessions, for the benchmarks

	mu      sync.Mutex
	targets map[string]Target // the set given to SetTargets
	run     *run              // non-nil while Run runs
	rate    float64           // the probe budget, probes a second; 0: none
}

// run is the state of one Run call; its maps are guarded by Checker.mu.
type run struct {
	ctx      context.Context
	wg       sync.WaitGroup
	workers  map[string]*worker
	verdicts map[string]Verdict // targets out of Unknown
	dirty    map[string]bool    // verdicts set or deleted since the last View
	last     View               // the last View published
	changed  bool               // a transition not yet published
	walMoved bool               // a WAL position moved since the last publish
	wake     chan struct{}      // capacity 1: tells the publisher to look
	budget   *budget            // spaces the probes by the probe budget
}

// worker is one target: a timer that starts each probe in a goroutine of its
// own, which judges the result and arms the timer for the next. Between
// probes a target holds no goroutine, only the timer and its tracker, nor
// while its probe waits for the probe budget.
type worker struct {
	t      Target
	ctx    context.Context // cancelled when the target goes: cuts a probe in flight short
	cancel context.CancelFunc
	// trMu guards tr and probing: the ticks and the session's polls judge
	// the target, and hand their progress to Shared in the order they made
	// it.
	trMu sync.Mutex
	tr   tracker
	// probing: the last tick probed (with Shared, a skipped tick clears it).
	probing bool
	// late: timeouts seen late in a row, not judged (see LateAfter).
	late int
	// phaseNs: where in every Interval its ticks fall (see Phases), set by
	// sync whenever the targets change.
	phaseNs atomic.Int64

	mu      sync.Mutex
	stopped bool
	timer   *time.Timer
	sess    *session       // the session of RoleInterval, nil when none is open
	backoff sessionBackoff // before the next session
	// urgent: the server ended the session; the next probe takes the
	// target Down at once if the server refuses or says it is going.
	urgent bool
	// owed: a session poll went unanswered; the next probe is the one
	// owed at once (a dead host sends no reset), and when it is seen late
	// (not judged, see LateAfter), another follows at once too.
	owed bool
	// again: ProbeNow came while a tick ran: the next tick runs at once.
	again bool
	// queued: the probe waits for the probe budget (budget.admit).
	queued bool
	// parked: its timer waits beyond the next Interval, for the time
	// Shared said another checker's verdict covers it (see Parking).
	parked bool

	// Guarded by the Run's budget.mu: the place in its queue (-1: not in
	// it), the key it is ordered by and when it came.
	qi       int
	key      time.Time
	queuedAt time.Time
}

// New returns a Checker for cfg, with defaults applied to its zero fields.
// The error names the field that is wrong.
func New(cfg Config) (*Checker, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := &Checker{cfg: cfg, targets: map[string]Target{}, rate: cfg.ProbeBudget}
	switch cfg.Check {
	case CheckTCP:
		c.probe = tcpProbe(cfg.Timeout, cfg.Source)
	case CheckPostgres:
		c.probe = postgresProbe(cfg.Options, cfg.Timeout, cfg.Source)
	}
	return c, nil
}

// SetTargets replaces the set of targets. Targets whose Key and Addr did not
// change keep their state and timer; removed targets stop (a probe in
// flight is cut short and its socket closed) and leave the View; a Key whose
// Addr changed starts over from Unknown. When Keys repeat, the last one wins.
// It may be called before, during or after Run.
func (c *Checker) SetTargets(ts []Target) {
	want := make(map[string]Target, len(ts))
	for _, t := range ts {
		want[t.Key] = t
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.targets = want
	if c.run != nil {
		c.sync(c.run)
	}
}

// Run checks the targets until ctx is done, calling publish with a new View
// after each verdict change: a target's State, its Role while Up, its Cause
// while Down, or its removal by SetTargets (several changes within a few
// milliseconds make one View). With ReportWAL, a moved WAL position alone
// publishes too, at most once per Interval. publish is never called concurrently and may take its time:
// changes meanwhile are published together afterwards. When Run returns, all
// the goroutines it started have ended and their sockets are closed. A Checker
// runs one Run at a time; Run may be called again after it returned, and then
// starts every target over from Unknown.
func (c *Checker) Run(ctx context.Context, publish func(View)) {
	if publish == nil {
		publish = func(View) {}
	}
	r := &run{
		ctx:      ctx,
		workers:  map[string]*worker{},
		verdicts: map[string]Verdict{},
		dirty:    map[string]bool{},
		wake:     make(chan struct{}, 1),
	}
	c.mu.Lock()
	if c.run != nil {
		c.mu.Unlock()
		panic("health: Run called while another Run of the same Checker is running")
	}
	r.budget = newBudget(c.rate, &r.wg, func(w *worker, waited time.Duration) bool { return c.granted(r, w, waited) })
	c.run = r
	c.sync(r)
	c.mu.Unlock()

	defer func() {
		c.mu.Lock()
		for _, w := range r.workers {
			r.stop(w)
		}
		c.run = nil
		c.mu.Unlock()
		r.budget.close()
		r.wg.Wait()
	}()
	c.publishLoop(r, publish)
}

// phase is where in every Interval w's ticks fall (see Phases).
func (w *worker) phase() time.Duration { return time.Duration(w.phaseNs.Load()) }

// sync starts and stops workers so that r runs c.targets, each at its
// phase among them. c.mu is held.
func (c *Checker) sync(r *run) {
	phases := Phases(slices.Collect(maps.Keys(c.targets)), c.cfg.Interval)
	for k, w := range r.workers {
		if t, ok := c.targets[k]; ok && t.Addr == w.t.Addr {
			continue
		}
		r.stop(w)
		delete(r.workers, k)
		if _, ok := r.verdicts[k]; ok {
			delete(r.verdicts, k)
			r.dirty[k] = true
			r.changed = true
		}
	}
	for k, t := range c.targets {
		if w, ok := r.workers[k]; ok {
			w.phaseNs.Store(int64(phases[k]))
			continue
		}
		ctx, cancel := context.WithCancel(r.ctx)
		w := &worker{t: t, ctx: ctx, cancel: cancel, tr: tracker{rise: c.cfg.Rise, fall: c.cfg.Fall}, qi: -1}
		w.phaseNs.Store(int64(phases[k]))
		r.workers[k] = w
		r.wg.Add(1) // until the worker ends: see stop and tick
		w.mu.Lock()
		w.timer = time.AfterFunc(rand.N(c.cfg.Interval), func() { c.tick(r, w) })
		w.mu.Unlock()
	}
	if r.changed {
		r.signal()
	}
}

// signal wakes the publisher without blocking.
func (r *run) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// stop ends a worker: a probe in flight is cut short, none starts again.
// The worker's wg count is released here when its timer was pending or its
// probe was waiting for the budget, else by the tick that runs or is about
// to run.
func (r *run) stop(w *worker) {
	w.mu.Lock()
	w.stopped = true
	pending := w.timer.Stop()
	if w.queued && r.budget.remove(w) {
		w.queued, pending = false, true
	}
	w.mu.Unlock()
	w.cancel()
	if pending {
		r.wg.Done()
	}
}

// tick runs when w's probe falls due: it asks Shared whether this checker
// probes w and, when it does, probes it once the probe budget allows (see
// check); otherwise it closes w's session and arms the timer for the next
// tick, an Interval on.
func (c *Checker) tick(r *run, w *worker) {
	if w.isStopped() {
		r.wg.Done()
		return
	}
	now := time.Now()
	probe, continuing, until := c.claim(w)
	if !probe {
		c.skip(r, w, now, until)
		return
	}
	// When the budget is short, the probes due longest ago go first, and
	// a target this checker probed at its last tick (with Shared: one this
	// instance holds, or took up before) an Interval ahead of one it takes
	// up now: the verdicts it already gives keep their rhythm, and a target
	// taken up waits at most an Interval longer than they do.
	key := now
	if continuing {
		key = now.Add(-c.cfg.Interval)
	}
	if !c.admit(r, w, key) {
		return // stopped, or the budget starts the probe in its turn (granted)
	}
	c.check(r, w)
}

// admit reports whether w's probe may start now. Otherwise w was stopped
// (its wg count released here) or waits for the budget, which starts the
// probe in its turn; w holds its wg count meanwhile.
func (c *Checker) admit(r *run, w *worker, key time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		r.wg.Done()
		return false
	}
	if r.budget.admit(w, key) {
		return true
	}
	w.queued = true
	return false
}

// granted starts w's probe, whose turn came after it waited for the
// budget, unless w stopped or Shared no longer gives w to this checker (the
// fleet gave it back meanwhile), and reports whether it started.
func (c *Checker) granted(r *run, w *worker, waited time.Duration) bool {
	w.mu.Lock()
	w.queued = false
	stopped := w.stopped
	w.mu.Unlock()
	if stopped {
		r.wg.Done()
		return false
	}
	if probe, _, _ := c.claim(w); !probe {
		c.next(r, w, time.Now(), false)
		return false
	}
	if c.cfg.ObserveBudget != nil {
		c.cfg.ObserveBudget(waited)
	}
	go c.check(r, w)
	return true
}

// check runs one probe of w, judges it, reports, and arms the timer for the
// next tick: Interval after this probe started, or at once when it took
// longer. Never two in flight. A probe that connected opens the session of
// RoleInterval, where one may be kept; a tick that does not probe, and a
// probe that failed, close it.
func (c *Checker) check(r *run, w *worker) {
	start := time.Now()
	keep := false
	urgent, owed := w.takeUrgent()
	starve.Look()
	res := c.probeOnce(w.ctx, w.t.Addr)
	took := time.Since(start)
	if w.ctx.Err() == nil { // else cut short by removal or shutdown: not a result
		w.trMu.Lock()
		starved := starve.Since
		if c.starved != nil {
			starved = c.starved
		}
		late := res.cause == CauseTimeout && (took > LateAfter(c.cfg.Timeout) || starved(start))
		if late && w.late < w.tr.fall && w.tr.v.State != Unknown {
			// Seen late: the answer may have come in time to a
			// process that did not run. The verdict stands, and is
			// handed on as it was (a holder's status stays current);
			// a server that ended the session, or a session poll
			// that went unanswered, is still to be judged, by a probe
			// at once as it was to be (not an Interval on: at most
			// fall such probes in a row go unjudged).
			w.late++
			c.recorded(r, w, false, false)
			w.trMu.Unlock()
			if urgent || owed {
				w.mu.Lock()
				w.urgent, w.owed, w.again = w.urgent || urgent, w.owed || owed, true
				w.mu.Unlock()
			}
			if c.cfg.Observe != nil {
				c.cfg.Observe(c.cfg.Check, CauseLate, took)
			}
			c.next(r, w, start, false)
			return
		}
		if !late {
			w.late = 0
		}
		if c.cfg.Observe != nil {
			c.cfg.Observe(c.cfg.Check, res.cause, took)
		}
		var changed, walMoved bool
		if urgent && going(res.cause) {
			changed = w.tr.down(res, start)
		} else {
			changed, walMoved = w.tr.record(res, start)
		}
		c.recorded(r, w, changed, walMoved)
		// A host that left a session poll unanswered is probed at once
		// until it answers or is Down: the failures that take it out
		// must not wait an Interval each (a success between the poll
		// and these probes, or a poll's failure seen late, leaves more
		// of them to make than the one owed).
		owed = owed && res.cause != CauseOK && w.tr.v.State != Down
		w.trMu.Unlock()
		if owed {
			w.mu.Lock()
			w.owed, w.again = true, true
			w.mu.Unlock()
		}
		// A server that refuses new sessions with 57P03 may be waiting
		// for every session to end (a smart shutdown): ours must not
		// hold it up.
		keep = res.cause == CauseOK && c.mayKeepSession(w)
	}
	c.next(r, w, start, keep)
}

// LateAfter is how long after its start a call given timeout that ran out
// of time may end and still be taken for the peer's failure to answer in
// time: the timeout and a quarter more, at least 50 ms. A call given a
// timeout ends within a few milliseconds of it on a machine that runs it;
// one that ends later ran late, its process starved of CPU (a loaded
// machine, a fleet started together on too few cores), and what it waited
// for may have come in time, unseen.
//
// A timeout is seen late too when a goroutine of the process waited to
// run for starve.Bound or more meanwhile: the timer that ends a probe
// runs first, while the connection's answer waits its turn, so a starved
// probe can end on time and still have missed an answer that came.
//
// The checks do not judge such a probe's timeout, up to Fall in a row
// (the next ones count): taking it for the node's would take healthy
// nodes out of every answer because this instance is slow, and each such
// change costs the instance a new zone, starving it further. A node that
// really stops answering still leaves within twice its Fall probes on a
// starved machine, and within Fall on one that runs them on time.
func LateAfter(timeout time.Duration) time.Duration {
	return timeout + max(timeout/4, 50*time.Millisecond)
}

// next opens w's session when keep, else closes it, and arms the timer for
// w's next tick, Interval after start, or earlier to meet w's phase (see
// NextProbe; at once after a ProbeNow that came meanwhile), unless w
// stopped.
func (c *Checker) next(r *run, w *worker, start time.Time, keep bool) {
	c.arm(r, w, NextProbe(w.phase(), start.Add(c.cfg.Interval), c.cfg.Interval), keep)
}

// arm opens w's session when keep, else closes it, and arms the timer for
// w's next tick at at (at once after a ProbeNow that came meanwhile),
// unless w stopped.
func (c *Checker) arm(r *run, w *worker, at time.Time, keep bool) {
	c.armParked(r, w, at, keep, false)
}

// armParked is arm, noting whether the tick at is one Shared put beyond
// the next Interval (see Parking).
func (c *Checker) armParked(r *run, w *worker, at time.Time, keep, parked bool) {
	if keep {
		c.openSession(r, w)
	} else {
		w.closeSession()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		r.wg.Done()
		return
	}
	next := time.Until(at)
	w.parked = parked
	if w.again {
		next, w.again, w.parked = 0, false, false
	}
	w.timer.Reset(next)
}

// skip arms the timer for the next tick of w, whose tick at now Shared
// gave to another checker: at w's phase (see Phases) nearest to an
// Interval on. Phases lie on a grid of PhaseGrid shared by every target
// (and every process): a fleet instance asks Shared about every target
// once an Interval and probes only its share; 1,000 targets at 2 s are 500
// ticks a second, each waking the process on its own when their times are
// spread; on the grid, those due together run in one wake (40 a second).
//
// When Shared said until when another checker covers w (see Parking), the
// tick is the last point of w's phase before then, if that is later: w
// is parked, and Recheck brings its tick back within an Interval.
func (c *Checker) skip(r *run, w *worker, now, until time.Time) {
	at, parked := NextSkipped(w.phase(), now, until, c.cfg.Interval)
	c.armParked(r, w, at, false, parked)
}

// NextSkipped is the next tick after one at now that Shared gave to
// another checker: the point of phase nearest to an Interval on
// (NextIdle), or, when Shared said another covers the target until then
// (see Parking; zero: it did not), the last point of phase before until
// if that is later, and parked true.
func NextSkipped(phase time.Duration, now, until time.Time, interval time.Duration) (at time.Time, parked bool) {
	at = NextIdle(phase, now.Add(interval), interval)
	if until.IsZero() {
		return at, false
	}
	if last := until.Add(-offPhase(phase, until, interval)); last.After(at) {
		return last, true
	}
	return at, false
}

// Recheck brings the tick of the target key, parked until a time Shared
// gave (see Parking), back to the next point of its phase: Shared may
// give it to this checker before that time after all. A target not
// parked is left as it is.
func (c *Checker) Recheck(key string) {
	if _, w := c.worker(key); w != nil {
		c.recheck(w)
	}
}

// RecheckAll is Recheck of every target: something every parked target's
// cover turns on changed (the members, the mode).
func (c *Checker) RecheckAll() {
	c.mu.Lock()
	var ws []*worker
	if c.run != nil {
		ws = make([]*worker, 0, len(c.run.workers))
		for _, w := range c.run.workers {
			ws = append(ws, w)
		}
	}
	c.mu.Unlock()
	for _, w := range ws {
		c.recheck(w)
	}
}

func (c *Checker) recheck(w *worker) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.parked || w.stopped {
		return
	}
	w.parked = false
	// A timer that already fired runs its tick, which asks Shared.
	if w.timer.Stop() {
		now := time.Now()
		w.timer.Reset(NextIdle(w.phase(), now.Add(c.cfg.Interval/2), c.cfg.Interval).Sub(now))
	}
}

// Phases returns where in every interval the ticks of each of keys fall,
// the same in every process that has the same keys (Unix time modulo
// interval): the keys ordered by a hash, dealt in that order over the
// points of the grid of PhaseGrid, as evenly as they go (1,000 keys at 2 s:
// 25 at each of 40 points). Whichever instance of a fleet probes a target
// probes it at its phase, so that the fleet's probes stay spread evenly
// over the interval whenever and however often leases move: without it,
// the leases one instance takes together (at its start, or when a member
// leaves) are probed together, and stay together every interval after. A
// key added or removed moves the others' phases by a grid step at most
// when there are more keys than grid points (else by an interval divided
// by the keys at most).
func Phases(keys []string, interval time.Duration) map[string]time.Duration {
	grid := PhaseGrid(interval)
	steps := max(1, int(interval/grid))
	type ranked struct {
		h   uint64
		key string
	}
	rs := make([]ranked, 0, len(keys))
	for _, k := range keys {
		h := fnv.New64a()
		h.Write([]byte(k))
		rs = append(rs, ranked{h.Sum64(), k})
	}
	slices.SortFunc(rs, func(a, b ranked) int {
		if c := cmp.Compare(a.h, b.h); c != 0 {
			return c
		}
		return strings.Compare(a.key, b.key)
	})
	out := make(map[string]time.Duration, len(rs))
	for i, r := range rs {
		out[r.key] = time.Duration(i*steps/len(rs)) * grid
	}
	return out
}

// NextIdle is the next tick after one that did not probe, at when the
// interval puts it: the point of phase (see Phases) nearest to at.
func NextIdle(phase time.Duration, at time.Time, interval time.Duration) time.Time {
	off := offPhase(phase, at, interval)
	if off > interval/2 {
		return at.Add(interval - off)
	}
	return at.Add(-off)
}

// offPhase is how far at lies after the last point of phase, in [0,
// interval).
func offPhase(phase time.Duration, at time.Time, interval time.Duration) time.Duration {
	off := (time.Duration(at.UnixNano()) - phase) % interval
	if off < 0 {
		off += interval
	}
	return off
}

// NextProbe is the next tick after a probe, at when that probe's rhythm
// puts it (an interval after its start): the same when it lies within a
// grid step of phase (see Phases), else the last point of phase before
// it. A probe is never late by it: the gap to the next probe only
// shortens, once, when a target is taken up off its phase (a lease taken
// and probed at once, a session that ended, a probe the budget held
// back).
func NextProbe(phase time.Duration, at time.Time, interval time.Duration) time.Time {
	off, tol := offPhase(phase, at, interval), PhaseGrid(interval)
	if off < tol || off > interval-tol {
		return at
	}
	return at.Add(-off)
}

// PhaseGrid is the grid of Phases, which skip rounds ticks to as well: a
// fortieth of the interval, at most 50 ms. Targets' ticks fall on its
// points, so a checker's probes start in bursts that far apart.
func PhaseGrid(interval time.Duration) time.Duration {
	return max(min(interval/40, 50*time.Millisecond), time.Millisecond)
}

// recorded hands w's progress to Shared and reports its verdict. w.trMu is
// held.
func (c *Checker) recorded(r *run, w *worker, changed, walMoved bool) {
	if c.cfg.Shared != nil {
		c.cfg.Shared.Record(w.t, w.tr.progress())
	}
	c.report(r, w, w.tr.v, changed, walMoved)
}

// takeUrgent reports and clears w.urgent and w.owed.
func (w *worker) takeUrgent() (urgent, owed bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	urgent, owed = w.urgent, w.owed
	w.urgent, w.owed = false, false
	return urgent, owed
}

// claim reports whether this tick probes w: always without Shared; with it,
// when Shared says so, continuing from its seed when w was not probing.
// continuing: w's last tick probed it too.
// until: when probe is false, until when Shared gives w to another
// checker for sure (see Parking); zero when it does not say.
func (c *Checker) claim(w *worker) (probe, continuing bool, until time.Time) {
	w.trMu.Lock()
	defer w.trMu.Unlock()
	continuing = w.probing
	if c.cfg.Shared == nil {
		w.probing = true
		return true, continuing, until
	}
	var seed Progress
	if p, ok := c.cfg.Shared.(Parking); ok {
		probe, seed, until = p.ClaimParked(w.t)
	} else {
		probe, seed = c.cfg.Shared.Claim(w.t)
	}
	if !probe {
		w.probing = false
		return false, continuing, until
	}
	if !w.probing && !seed.isZero() {
		w.tr.load(seed)
	}
	w.probing = true
	return true, continuing, time.Time{}
}

// worker returns the running Run and its worker of the target key, nil
// when no Run runs or key is not among its targets.
func (c *Checker) worker(key string) (*run, *worker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run == nil {
		return nil, nil
	}
	return c.run, c.run.workers[key]
}

// ProbeNow probes the target key at once, or as soon as the probe in flight
// ends, unless it is not a target of a running Run: with Shared, a checker
// that has just been given a target calls it so that the target is not left
// unprobed until its next tick; a session that ended calls it to learn at
// once whether the server is going. The probe budget applies: a probe
// waiting for it is not started again, as it has not started yet.
func (c *Checker) ProbeNow(key string) {
	_, w := c.worker(key)
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.stopped, w.queued:
	case w.timer.Stop():
		w.parked = false
		w.timer.Reset(0)
	default: // a tick runs or is about to: the next one follows it at once
		w.again = true
	}
}

// ProbeAtPhase moves the probe of the target key that waits for the probe
// budget to the next point of its phase (see Phases), unless none waits:
// a fleet instance that takes back the targets it held before Redis
// stopped answering has their verdicts from its own probes, and probes
// them at their phases from then on, as the fleet does, rather than all
// at once as the budget frees up.
func (c *Checker) ProbeAtPhase(key string) {
	r, w := c.worker(key)
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// A probe the budget has taken off its queue to start is left to
	// start (remove finds it gone).
	if w.stopped || !w.queued || !r.budget.remove(w) {
		return
	}
	// It keeps the wg count it held while queued, now for its timer.
	w.queued = false
	now := time.Now()
	w.timer.Reset(NextIdle(w.phase(), now.Add(c.cfg.Interval/2), c.cfg.Interval).Sub(now))
}

// SetProbeBudget changes Config.ProbeBudget: at most perSecond probes start
// a second, 0 for no budget (a negative, NaN or infinite rate is taken as
// 0). Probes waiting for the budget start by the new rate.
func (c *Checker) SetProbeBudget(perSecond float64) {
	if !(perSecond > 0) || math.IsInf(perSecond, 1) {
		perSecond = 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rate = perSecond
	if c.run != nil {
		c.run.budget.setRate(perSecond)
	}
}

func (w *worker) isStopped() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stopped
}

// probeOnce runs one probe bounded by Timeout.
func (c *Checker) probeOnce(ctx context.Context, addr netip.AddrPort) result {
	if !addr.IsValid() {
		return result{cause: CauseUnreachable, detail: "the target has no valid address and port"}
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	return c.probe(ctx, addr)
}

// report records a worker's verdict for the next View and wakes the
// publisher when there is something to publish.
func (c *Checker) report(r *run, w *worker, v Verdict, changed, walMoved bool) {
	if v.State == Unknown {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if r.workers[w.t.Key] != w {
		return // removed or replaced meanwhile
	}
	r.verdicts[w.t.Key] = v
	r.dirty[w.t.Key] = true
	if changed {
		r.changed = true
		r.signal()
	} else if walMoved && c.cfg.ReportWAL {
		r.walMoved = true
		r.signal()
	}
}

// publishLoop publishes Views until r.ctx is done: at once (after coalesce)
// on a transition, at most once per Interval when only WAL positions moved.
func (c *Checker) publishLoop(r *run, publish func(View)) {
	wait := time.NewTimer(time.Hour)
	wait.Stop()
	var last time.Time // the last publish
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-r.wake:
		case <-wait.C: // a WAL-only publish fell due
		}
		// Let a burst of changes gather into one View.
		wait.Reset(coalesce)
		select {
		case <-r.ctx.Done():
			return
		case <-wait.C:
		}
		c.mu.Lock()
		due := r.changed
		if !due && r.walMoved {
			next := last.Add(c.cfg.Interval)
			if now := time.Now(); !now.Before(next) {
				due = true
			} else {
				wait.Reset(next.Sub(now))
			}
		}
		var v View
		if due {
			// The last View with what was reported since: a View's
			// making costs its changes, not every target.
			e := r.last.Edit()
			for k := range r.dirty {
				if x, ok := r.verdicts[k]; ok {
					e.Set(k, x)
				} else {
					e.Delete(k)
				}
			}
			clear(r.dirty)
			v = e.View()
			r.last = v
			r.changed, r.walMoved = false, false
		}
		c.mu.Unlock()
		if due {
			publish(v)
			last = time.Now()
		}
	}
}
