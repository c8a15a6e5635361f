package lock

import (
	"context"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"net/netip"
	"runtime/metrics"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// Settings of the scale benchmark's fleets: a tcp check with a 500ms timeout,
// and the default rise and fall.
const (
	scalePrefix  = "scale:"
	scaleTimeout = 500 * time.Millisecond
	scaleRise    = health.DefaultRise
	scaleFall    = health.DefaultFall
	// scaleDialTimeout and scaleIOTimeout are what the plugin's Redis
	// client allows each dial, and each read and write (redisTimeout,
	// redisIOTimeout).
	scaleDialTimeout = 500 * time.Millisecond
	scaleIOTimeout   = MaxCallTimeout
	// probeBucket is what probe starts are counted by.
	probeBucket = 100 * time.Millisecond
	// scaleLogKinds is how many kinds of log lines a report shows.
	scaleLogKinds = 12
	// scaleMaxRun bounds a fleet's run: probe starts after it are not
	// counted.
	scaleMaxRun = 2 * time.Hour
)

// scaleFleet is n coordinators in this process, each with its own Redis
// client and a simulated checker (simChecker), sharing m targets whose
// backends are up or down as the benchmark says, on one redis-server.
type scaleFleet struct {
	tb       testing.TB
	srv      *redistest.Server
	admin    *redis.Client // INFO and CLIENT PAUSE: not counted as the fleet's
	interval time.Duration
	rise     uint8
	fall     uint8
	budget   float64 // each instance's probe budget, probes a second; 0: none

	targets []health.Target
	index   map[string]int32
	phases  []time.Duration // by target: where in every interval its ticks fall (health.Phases)
	down    []atomic.Bool   // by target: the backend refuses connections

	start     time.Time      // of bucket 0
	buckets   []atomic.Int32 // probe starts per probeBucket since start
	perTarget []atomic.Int32 // probe starts per target

	ins     []*scaleInstance
	clients []*redis.Client // the instances'
	ctx     context.Context // the instances' Runs
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	writes, published, fencedOut atomic.Int64 // status writes (Observer.Write)
	resyncs, resyncErrs          atomic.Int64
	views                        atomic.Int64 // Views the instances made (each a copy of every target's entry)
	applied, stale, rejected     atomic.Int64 // statuses read (Observer.Message)
	sent, trips                  atomic.Int64 // commands the instances sent, round trips
	delayed, waitMax             atomic.Int64 // probes that waited for the budget, the longest wait (ns)
	logs                         scaleLogs

	pingMu sync.Mutex
	pingAt []time.Time // when each PING of the harness was sent
	pingRT []time.Duration

	settling atomic.Bool // apply counts the targets Up
	flip     atomic.Pointer[scaleFlip]
	// While the flips wait: the instances' Redis calls, and what this
	// process's runtime counted (see flipBackends).
	flipCalls callTimes
	flipProp  callTimes // from a holder's write to its status applied at an instance
	flipProc  procSpans
	judge     atomic.Pointer[scaleJudge]
}

// scaleInstance is one coordinator of the fleet and its checker.
type scaleInstance struct {
	coord  *Coordinator
	check  *simChecker
	up     atomic.Int32                // targets Up in its last View, while settling
	view   atomic.Pointer[health.View] // its last View, while settling
	viewAt atomic.Int64                // when it came, Unix ns
	shown  atomic.Bool                 // Run has made its first View

	// The last View apply counted and its targets Up (apply's goroutine
	// only, see countUp).
	counted   health.View
	countedUp int

	mu    sync.Mutex
	modes []modeChange
	// What its subscription did with each key's messages it did not
	// apply, and its resyncs (see traceSubscription).
	dropped    map[string]string
	subscribed []time.Time       // when it subscribed (again)
	accepted   map[string]string // each key's last status offered and accepted: version, how, when
}

// traceSubscription notes, for explain, the messages in's subscription
// heard but dropped (not newer than the key's last version) or did not
// accept, the statuses it accepted, and when it subscribed.
func (in *scaleInstance) traceSubscription() {
	sub := in.coord.sub
	heard, accept, before := sub.Heard, sub.Accept, sub.BeforeResync
	note := func(key, what string) {
		in.mu.Lock()
		defer in.mu.Unlock()
		if in.dropped == nil {
			in.dropped = map[string]string{}
		}
		in.dropped[key] += what + " "
	}
	sub.Heard = func(key string, v int64, b []byte) {
		note(key, fmt.Sprintf("heard-not-newer(v %d, last %d)", v, sub.last[key]))
		heard(key, v, b)
	}
	sub.Accept = func(key string, v int64, b []byte) bool {
		ok := accept(key, v, b)
		if !ok {
			note(key, fmt.Sprintf("not-accepted(v %d)", v))
			return ok
		}
		in.mu.Lock()
		defer in.mu.Unlock()
		if in.accepted == nil {
			in.accepted = map[string]string{}
		}
		in.accepted[key] = fmt.Sprintf("v %d at %s", v, time.Now().Format("15:04:05.000"))
		return ok
	}
	sub.BeforeResync = func() bool {
		ok := before()
		in.mu.Lock()
		in.subscribed = append(in.subscribed, time.Now())
		in.mu.Unlock()
		return ok
	}
}

// modeChange is a coordinator's Mode, and when it said so.
type modeChange struct {
	at   time.Time
	mode string
}

// changes returns the instance's mode changes.
func (in *scaleInstance) changes() []modeChange {
	in.mu.Lock()
	defer in.mu.Unlock()
	return slices.Clone(in.modes)
}

// scaleObserver hears one instance's coordinator.
type scaleObserver struct {
	fl *scaleFleet
	in *scaleInstance
}

func (o scaleObserver) Mode(mode string) {
	o.in.mu.Lock()
	defer o.in.mu.Unlock()
	o.in.modes = append(o.in.modes, modeChange{time.Now(), mode})
}

func (o scaleObserver) Leases(int) {}
func (o scaleObserver) Propagation(d time.Duration) {
	if o.fl.flipCalls.on.Load() {
		o.fl.flipProp.add(d)
	}
}
func (o scaleObserver) Extend(int, int) {}

func (o scaleObserver) Message(result string) {
	switch result {
	case "applied":
		o.fl.applied.Add(1)
	case "stale":
		o.fl.stale.Add(1)
	default:
		o.fl.rejected.Add(1)
	}
}

func (o scaleObserver) Resync(err error) {
	o.fl.resyncs.Add(1)
	if err != nil {
		o.fl.resyncErrs.Add(1)
	}
}

func (o scaleObserver) Write(ok, published bool) {
	o.fl.writes.Add(1)
	if published {
		o.fl.published.Add(1)
	}
	if !ok {
		o.fl.fencedOut.Add(1)
	}
}

// scaleLogs counts the coordinators' log lines by format, keeping the
// first line of each: hundreds of instances would drown the report.
type scaleLogs struct {
	mu     sync.Mutex
	counts map[string]int
	first  map[string]string
}

func (l *scaleLogs) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts == nil {
		l.counts, l.first = map[string]int{}, map[string]string{}
	}
	if l.counts[format] == 0 {
		l.first[format] = fmt.Sprintf(format, args...)
	}
	l.counts[format]++
}

// scaleRedisLog sends go-redis's own messages (a dial that failed, a
// message dropped) to the running fleet's scaleLogs, as the plugin keeps
// them out of its log (redisLog), or to stderr outside a fleet.
type scaleRedisLog struct{}

// scaleRedisLogs is the running fleet's scaleLogs: go-redis's logger is
// the process's.
var scaleRedisLogs atomic.Pointer[scaleLogs]

func (scaleRedisLog) Printf(_ context.Context, format string, v ...any) {
	if l := scaleRedisLogs.Load(); l != nil {
		l.logf("go-redis: "+format, v...)
		return
	}
	log.Printf("redis: "+format, v...)
}

// summary returns one line per kind of log line, most frequent first (at
// most scaleLogKinds), and clears the counts.
func (l *scaleLogs) summary() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var kinds []string
	for f := range l.counts {
		kinds = append(kinds, f)
	}
	sort.Slice(kinds, func(i, j int) bool { return l.counts[kinds[i]] > l.counts[kinds[j]] })
	var out []string
	for i, f := range kinds {
		if i == scaleLogKinds {
			out = append(out, fmt.Sprintf("and %d kinds more", len(kinds)-i))
			break
		}
		out = append(out, fmt.Sprintf("%6d x %s", l.counts[f], l.first[f]))
	}
	l.counts, l.first = nil, nil
	return out
}

// scaleTargets returns m targets: keys as the registry names nodes, and
// loopback addresses nothing dials (the probes are simulated).
func scaleTargets(m int) []health.Target {
	ts := make([]health.Target, m)
	for i := range ts {
		ts[i] = health.Target{Key: fmt.Sprintf("c%d/n%d", i/3, i%3),
			Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(i >> 16), byte(i >> 8), byte(i)}), 5432)}
	}
	return ts
}

// startScaleFleet starts n coordinators on a new redis-server, and gives
// them the m targets once every one is a member of the fleet (a lone first
// member would take every lease and probe every target at once, aligning
// its ticks to that moment) and has made its first View (before it, a
// coordinator probes every target no status covers at once: in a fleet
// started from nothing, every target, and the ticks of every instance
// would be aligned to that moment). It stops them when the benchmark
// ends.
func startScaleFleet(tb testing.TB, n, m int, interval time.Duration, budget float64) *scaleFleet {
	tb.Helper()
	// The server's log stays out of the report.
	srv, err := redistest.StartProcess(tb.TempDir(), nil)
	if err != nil {
		tb.Fatalf("this benchmark needs a real redis-server and could not start one: %v", err)
	}
	tb.Cleanup(srv.Stop)
	// Redis on a machine of its own, as the fleet these coordinators
	// stand for would run it, rather than one process beside all of them
	// on two cores.
	if _, _, err := srv.NiceFromEnv("SCALE_REDIS_NICE"); err != nil {
		tb.Fatal(err)
	}
	fl := &scaleFleet{tb: tb, srv: srv, admin: redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true}), interval: interval, rise: scaleRise, fall: scaleFall, budget: budget,
		targets: scaleTargets(m), index: make(map[string]int32, m), down: make([]atomic.Bool, m),
		start: bucketStart(time.Now(), interval), buckets: make([]atomic.Int32, scaleMaxRun/probeBucket), perTarget: make([]atomic.Int32, m)}
	keys := make([]string, m)
	for i, t := range fl.targets {
		fl.index[t.Key] = int32(i)
		keys[i] = t.Key
	}
	phases := health.Phases(keys, interval)
	fl.phases = make([]time.Duration, m)
	for i, k := range keys {
		fl.phases[i] = phases[k]
	}
	fl.ctx, fl.cancel = context.WithCancel(context.Background())
	redis.SetLogger(scaleRedisLog{})
	scaleRedisLogs.Store(&fl.logs)
	tb.Cleanup(fl.stop)
	for range n {
		fl.add(false)
	}
	fl.wg.Go(func() { fl.pingLoop(fl.ctx) })
	fl.awaitMembers()
	fl.await(time.Minute, "every instance's first View", func() bool {
		for _, in := range fl.ins {
			if !in.shown.Load() {
				return false
			}
		}
		return true
	})
	fl.settling.Store(true)
	for _, in := range fl.ins {
		in.coord.SetTargets(fl.targets)
		in.check.setTargets()
	}
	return fl
}

// grow adds k instances to a settled fleet, as a fleet scaled out does:
// each knows the targets from its start (the registry's), and runs at
// a random point of a cycle. It returns once they are members.
func (fl *scaleFleet) grow(k int) {
	fl.settling.Store(true)
	for range k {
		fl.add(true)
	}
	// Each has heard Redis once (joined, or gone local): the fleet's
	// members may lapse and come back meanwhile on a loaded machine,
	// which the settling that follows waits out.
	last := ""
	if !fl.poll(time.Minute, func() bool {
		modes := map[string]int{}
		for _, in := range fl.ins {
			modes[in.coord.Mode()]++
		}
		members := -1
		f, err := ReadFleet(context.Background(), fl.admin, Config{Prefix: scalePrefix, Interval: fl.interval, Timeout: scaleTimeout}, nil)
		if err == nil {
			members = len(f.Members)
		}
		last = fmt.Sprintf("modes %v, %d members (%v)", modes, members, err)
		return modes[""] == 0
	}) {
		fl.tb.Fatalf("after %v: %d instances added, not all heard Redis: %s", time.Minute, k, last)
	}
}

// awaitMembers waits until every instance is a member of the fleet.
func (fl *scaleFleet) awaitMembers() {
	n := len(fl.ins)
	fl.await(time.Minute+time.Duration(n)*100*time.Millisecond, "every instance a member of the fleet", func() bool {
		f, err := ReadFleet(context.Background(), fl.admin, Config{Prefix: scalePrefix, Interval: fl.interval, Timeout: scaleTimeout}, nil)
		return err == nil && len(f.Members) == n
	})
}

// add starts one more instance: its coordinator, with its own Redis
// client, and its simulated checker, with the targets or without.
func (fl *scaleFleet) add(targets bool) {
	tb, ctx, interval, i := fl.tb, fl.ctx, fl.interval, len(fl.ins)
	rdb := redis.NewClient(&redis.Options{Addr: fl.srv.Addr(), ContextTimeoutEnabled: true,
		DialTimeout: scaleDialTimeout, ReadTimeout: scaleIOTimeout, WriteTimeout: scaleIOTimeout})
	rdb.AddHook(sentCounter{cmds: &fl.sent, trips: &fl.trips, calls: &fl.flipCalls})
	fl.clients = append(fl.clients, rdb)
	in := &scaleInstance{}
	coord, err := NewCoordinator(rdb, Config{Prefix: scalePrefix, Interval: interval, Timeout: scaleTimeout,
		Logf: fl.logs.logf, Observer: scaleObserver{fl, in}})
	if err != nil {
		tb.Fatal(err)
	}
	in.coord = coord
	in.traceSubscription()
	in.check = newSimChecker(fl, coord)
	coord.SetProbeNow(in.check.ProbeNow)
	coord.SetProbeAtPhase(in.check.ProbeAtPhase)
	coord.SetRecheck(in.check.Recheck, in.check.RecheckAll)
	if targets {
		coord.SetTargets(fl.targets)
		in.check.setTargets()
	}
	fl.ins = append(fl.ins, in)
	fl.wg.Go(func() { in.check.run(ctx) })
	// Instances started at once would look after their leases in
	// step (a cycle from each start) and take theirs at the same
	// moments, aligning the ticks of every lease taken: a fleet's
	// instances start at random points of a cycle, at least.
	delay := rand.N(interval / 2)
	fl.wg.Go(func() {
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		coord.Run(ctx, func(v health.View) { fl.apply(i, in, v) })
	})
}

// pingLoop sends Redis a PING every probeBucket until ctx is done,
// timing its round trip: how long Redis, and this loaded process, take to
// answer anyone.
func (fl *scaleFleet) pingLoop(ctx context.Context) {
	t := time.NewTicker(probeBucket)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		cctx, cancel := context.WithTimeout(ctx, time.Minute)
		err := fl.admin.Ping(cctx).Err()
		cancel()
		if err != nil {
			continue
		}
		fl.pingMu.Lock()
		fl.pingAt = append(fl.pingAt, start)
		fl.pingRT = append(fl.pingRT, time.Since(start))
		fl.pingMu.Unlock()
	}
}

// pings returns the round trips of the PINGs sent in [from, to), sorted.
func (fl *scaleFleet) pings(from, to time.Time) []time.Duration {
	fl.pingMu.Lock()
	defer fl.pingMu.Unlock()
	var out []time.Duration
	for i, at := range fl.pingAt {
		if !at.Before(from) && at.Before(to) {
			out = append(out, fl.pingRT[i])
		}
	}
	slices.Sort(out)
	return out
}

// lateness returns the most any instance's ticks ran late since the last
// call.
func (fl *scaleFleet) lateness() time.Duration {
	var l time.Duration
	for _, in := range fl.ins {
		l = max(l, in.check.lateness())
	}
	return l
}

// stop stops every instance (each releases its leases and leaves), then
// closes the Redis clients.
func (fl *scaleFleet) stop() {
	fl.cancel()
	fl.wg.Wait()
	for _, c := range fl.clients {
		c.Close()
	}
	fl.admin.Close()
	scaleRedisLogs.CompareAndSwap(&fl.logs, nil)
}

// await waits until cond holds, failing the benchmark after d.
func (fl *scaleFleet) await(d time.Duration, what string, cond func() bool) {
	fl.tb.Helper()
	if !fl.poll(d, cond) {
		fl.tb.Fatalf("after %v: %s", d, what)
	}
}

// poll waits until cond holds, at most d, and reports whether it did.
func (fl *scaleFleet) poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	return true
}

// apply hears the View of in, instance i.
func (fl *scaleFleet) apply(i int, in *scaleInstance, v health.View) {
	fl.views.Add(1)
	in.shown.Store(true)
	if fl.settling.Load() {
		up := in.countUp(v)
		in.up.Store(int32(up))
		in.view.Store(&v)
		in.viewAt.Store(time.Now().UnixNano())
	}
	if j := fl.judge.Load(); j != nil {
		j.judge(fl, i, v)
	}
	if f := fl.flip.Load(); f != nil {
		now := time.Now().UnixNano()
		for j, k := range f.keys {
			if v.At(fl.targets[k].Key).State == f.want {
				f.seen[i*len(f.keys)+j].CompareAndSwap(0, now)
			}
		}
	}
}

// countUp returns the targets Up in v, counted from the last View it
// counted by the entries that may differ (View.Changed), as the plugin
// makes its answers from each View: counting every entry of every View
// of every instance was, at 10,000 targets, a quarter of this process's
// work while a fleet settled, the phase the benchmark measures the
// coordinators' cost in.
func (in *scaleInstance) countUp(v health.View) int {
	keys, ok := v.Changed(in.counted)
	if !ok {
		up := upIn(v)
		in.counted, in.countedUp = v, up
		return up
	}
	up := in.countedUp
	seen := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		if in.counted.At(k).State == health.Up {
			up--
		}
		if v.At(k).State == health.Up {
			up++
		}
	}
	in.counted, in.countedUp = v, up
	return up
}

// upIn counts the targets Up in v, entry by entry.
func upIn(v health.View) int {
	up := 0
	for _, vd := range v.All() {
		if vd.State == health.Up {
			up++
		}
	}
	return up
}

// probed counts a probe start of target i at now (Unix ns).
func (fl *scaleFleet) probed(i int32, now int64) {
	if b := (now - fl.start.UnixNano()) / int64(probeBucket); b >= 0 && b < int64(len(fl.buckets)) {
		fl.buckets[b].Add(1)
	}
	fl.perTarget[i].Add(1)
}

// waited counts a probe that waited d for the budget.
func (fl *scaleFleet) waited(d time.Duration) {
	fl.delayed.Add(1)
	for {
		m := fl.waitMax.Load()
		if int64(d) <= m || fl.waitMax.CompareAndSwap(m, int64(d)) {
			return
		}
	}
}

// bucketStart is where bucket 0 begins: half a step of health.PhaseGrid
// before a point of the grid on which every target's ticks fall (Unix
// time modulo the interval). A checker starts its probes in bursts at
// those points, each a few milliseconds late (a timer's wake, more on a
// loaded machine); a bucket's edge on a point would split the burst
// between two buckets by that lateness, and the counts would measure the
// timers' jitter rather than the probe rate. With the edges between
// points, each probeBucket holds the bursts of whole points: two, at the
// grid of a 2 s interval.
func bucketStart(now time.Time, interval time.Duration) time.Time {
	grid := int64(health.PhaseGrid(interval))
	ns := now.UnixNano()
	return time.Unix(0, ns-ns%grid-grid/2)
}

// bucketOf is the bucket of t.
func (fl *scaleFleet) bucketOf(t time.Time) int { return int(t.Sub(fl.start) / probeBucket) }

// probes returns the probe starts per bucket in [from, to).
func (fl *scaleFleet) probes(from, to time.Time) []int {
	var out []int
	for b := max(fl.bucketOf(from), 0); b < min(fl.bucketOf(to), len(fl.buckets)); b++ {
		out = append(out, int(fl.buckets[b].Load()))
	}
	return out
}

// lastInterval is the probe starts in the last whole interval of buckets
// before now.
func (fl *scaleFleet) lastInterval() int {
	now := time.Now()
	sum := 0
	for _, c := range fl.probes(now.Add(-fl.interval-probeBucket), now.Add(-probeBucket)) {
		sum += c
	}
	return sum
}

// unsettled says why the fleet is not in its steady state, "" when it
// is: every instance coordinated and seeing every target Up, every lease
// held by one instance, and the last interval's probes within 5% of one
// per target.
func (fl *scaleFleet) unsettled() string {
	m := len(fl.targets)
	held := make(map[string]bool, m)
	for i, in := range fl.ins {
		if mode := in.coord.Mode(); mode != ModeCoordinated {
			return fmt.Sprintf("instance %d is %q", i, mode)
		}
		if up := int(in.up.Load()); up != m {
			return fmt.Sprintf("instance %d's View has %d of %d targets Up%s", i, up, m, fl.notUp(in))
		}
		for _, k := range in.coord.Held() {
			if held[k] {
				return fmt.Sprintf("two instances hold the lease of %s", k)
			}
			held[k] = true
		}
	}
	if len(held) != m {
		return fmt.Sprintf("%d of %d leases held", len(held), m)
	}
	if p := fl.lastInterval(); p < m*95/100 || p > m*105/100 {
		return fmt.Sprintf("%d probes in the last interval", p)
	}
	return ""
}

// notUp names a few targets in's last View does not have Up, and what
// its coordinator says of them now.
func (fl *scaleFleet) notUp(in *scaleInstance) string {
	v := in.view.Load()
	if v == nil {
		return ""
	}
	var out []string
	for _, t := range fl.targets {
		if (*v).At(t.Key).State == health.Up {
			continue
		}
		probe, seed := in.coord.Claim(t)
		holder := "held by no instance"
		for _, h := range fl.ins {
			if slices.Contains(h.coord.Held(), t.Key) {
				holder = fmt.Sprintf("its holder %.8s: %s; its checker: %s", h.coord.Token(), h.coord.explain(t), h.check.explain(fl.index[t.Key]))
			}
		}
		in.coord.mu.Lock()
		pending := in.coord.subPending
		in.coord.mu.Unlock()
		in.mu.Lock()
		var ago []string
		for _, at := range in.subscribed {
			ago = append(ago, time.Since(at).Round(time.Millisecond).String())
		}
		sub := fmt.Sprintf("its subscription: made %d times (%s ago), its read of every status pending %v; dropped %q; last message accepted %s (now %s)", len(in.subscribed), strings.Join(ago, ", "), pending, in.dropped[t.Key], in.accepted[t.Key], time.Now().Format("15:04:05.000"))
		in.mu.Unlock()
		out = append(out, fmt.Sprintf("%s %v (probes it: %v, seed %v %d/%d; %s; %s; %s)", t.Key, (*v).At(t.Key).State, probe, seed.Verdict.State, seed.OK, seed.Fail, in.coord.explain(t), sub, holder))
		if len(out) == 3 {
			break
		}
	}
	age := time.Since(time.Unix(0, in.viewAt.Load())).Round(100 * time.Millisecond)
	return fmt.Sprintf(" (that View made %v ago): %s", age, strings.Join(out, ", "))
}

// settle waits, at most d, for the steady state (see unsettled) to hold
// for an interval, and returns how long it took from the targets' start,
// or why it did not come.
func (fl *scaleFleet) settle(d time.Duration) (time.Duration, string) {
	var since time.Time
	why := ""
	fl.poll(d, func() bool {
		if why = fl.unsettled(); why != "" {
			since = time.Time{}
			return false
		}
		if since.IsZero() {
			since = time.Now()
		}
		return time.Since(since) >= fl.interval
	})
	fl.settling.Store(false)
	for _, in := range fl.ins {
		in.view.Store(nil)
	}
	return time.Since(fl.start), why
}

// scaleFlip is a set of targets whose backends changed state at once, and
// when each instance's View first showed each of them in the new state.
type scaleFlip struct {
	keys []int32
	want health.State
	at   time.Time
	seen []atomic.Int64 // Unix ns, by instance × key; 0: not yet
}

// scaleJudge judges every View of every instance while a stall runs:
// when each showed each stopped backend (keys) Down first, whether one
// showed it Up again after that, and how often one showed a backend that
// is up as Down. The stopped backends stay stopped meanwhile.
type scaleJudge struct {
	keys      []int32
	at        time.Time
	down      []atomic.Int64 // Unix ns of the first View showing it Down, by instance × key; 0: none yet
	upAgain   atomic.Int64   // Views showing a stopped backend Up after one showed it Down
	wrongDown atomic.Int64   // targets shown Down in a View whose backend is up
	example   atomic.Pointer[string]
}

// judge judges v, the View of instance i.
func (j *scaleJudge) judge(fl *scaleFleet, i int, v health.View) {
	now := time.Now().UnixNano()
	for n, k := range j.keys {
		switch v.At(fl.targets[k].Key).State {
		case health.Down:
			j.down[i*len(j.keys)+n].CompareAndSwap(0, now)
		case health.Up:
			if first := j.down[i*len(j.keys)+n].Load(); first != 0 {
				j.upAgain.Add(1)
				vd := v.At(fl.targets[k].Key)
				e := fmt.Sprintf("instance %d (%s) showed %s Up at +%v after showing it Down at +%v; the verdict shown was probed at +%v",
					i, fl.ins[i].coord.Mode(), fl.targets[k].Key, ms3(time.Duration(now-j.at.UnixNano())), ms3(time.Unix(0, first).Sub(j.at)), ms3(vd.Last.Sub(j.at)))
				j.example.CompareAndSwap(nil, &e)
			}
		}
	}
	for key, vd := range v.All() {
		if k, ok := fl.index[key]; ok && vd.State == health.Down && !fl.down[k].Load() {
			j.wrongDown.Add(1)
			e := fmt.Sprintf("instance %d showed %s Down (%s %s), its backend up", i, key, vd.Cause, vd.Detail)
			j.example.CompareAndSwap(nil, &e)
		}
	}
}

// stopForJudge stops the backends of keys and judges every View from now
// on (see scaleJudge).
func (fl *scaleFleet) stopForJudge(keys []int32) *scaleJudge {
	j := &scaleJudge{keys: keys, at: time.Now(), down: make([]atomic.Int64, len(fl.ins)*len(keys))}
	fl.judge.Store(j)
	for _, k := range keys {
		fl.down[k].Store(true)
	}
	return j
}

// procCounts is what this process's runtime has counted: how long its
// goroutines waited to run (/sched/latencies:seconds, per bucket), the
// collections of its heap, and the bytes allocated (which set them off).
// The flips' figures pass through several goroutines of this one process
// (a status write's reply, each instance's subscription and View), so
// they can be no better than what those goroutines waited.
type procCounts struct {
	waits     []uint64
	buckets   []float64
	cycles    uint64
	allocated uint64
}

// readProc reads the runtime's counts so far, in one read.
func readProc() procCounts {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}, {Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	var c procCounts
	if s[0].Value.Kind() == metrics.KindFloat64Histogram {
		h := s[0].Value.Float64Histogram()
		c.waits, c.buckets = slices.Clone(h.Counts), h.Buckets
	}
	if s[1].Value.Kind() == metrics.KindUint64 {
		c.cycles = s[1].Value.Uint64()
	}
	if s[2].Value.Kind() == metrics.KindUint64 {
		c.allocated = s[2].Value.Uint64()
	}
	return c
}

// procSpans adds up what the runtime counted over the spans added.
type procSpans struct {
	mu  sync.Mutex
	sum procCounts
}

// add adds what was counted from from to to (readProc's).
func (p *procSpans) add(from, to procCounts) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sum.cycles += to.cycles - from.cycles
	p.sum.allocated += to.allocated - from.allocated
	if len(from.waits) != len(to.waits) {
		return
	}
	if p.sum.waits == nil {
		p.sum.waits, p.sum.buckets = make([]uint64, len(to.waits)), to.buckets
	}
	for i := range to.waits {
		p.sum.waits[i] += to.waits[i] - from.waits[i]
	}
}

// counts returns the sums.
func (p *procSpans) counts() procCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	return procCounts{waits: slices.Clone(p.sum.waits), buckets: p.sum.buckets, cycles: p.sum.cycles, allocated: p.sum.allocated}
}

// waited returns the upper bound of the bucket that holds the q quantile
// of the goroutine waits counted, and how many were counted.
func (c procCounts) waited(q float64) (time.Duration, uint64) {
	var total uint64
	for _, n := range c.waits {
		total += n
	}
	if total == 0 {
		return 0, 0
	}
	want, seen := uint64(math.Ceil(q*float64(total))), uint64(0)
	for i, n := range c.waits {
		seen += n
		if seen >= want {
			// The bucket's upper bound; the last bucket has none.
			b := c.buckets[i+1]
			if math.IsInf(b, 1) {
				b = c.buckets[i]
			}
			return time.Duration(b * float64(time.Second)).Round(10 * time.Microsecond), total
		}
	}
	return 0, total
}

// flipResult is what a flip found: per key, from the flip to the first
// instance's View showing it and to the last one's.
type flipResult struct {
	first, last []time.Duration
	missed      int // keys × instances that did not show it in time
}

// flipBackends makes the backends of keys up or down, and waits, at most
// d, until every instance's View shows it.
func (fl *scaleFleet) flipBackends(keys []int32, up bool, d time.Duration) flipResult {
	want := health.Down
	if up {
		want = health.Up
	}
	n := len(fl.ins)
	f := &scaleFlip{keys: keys, want: want, seen: make([]atomic.Int64, n*len(keys))}
	f.at = time.Now()
	fl.flip.Store(f)
	fl.flipCalls.on.Store(true)
	defer fl.flipCalls.on.Store(false)
	from := readProc()
	defer func() { fl.flipProc.add(from, readProc()) }()
	for _, k := range keys {
		fl.down[k].Store(!up)
	}
	fl.poll(d, func() bool {
		for i := range f.seen {
			if f.seen[i].Load() == 0 {
				return false
			}
		}
		return true
	})
	fl.flip.Store(nil)
	var r flipResult
	for j := range keys {
		var first, last int64
		for i := range n {
			s := f.seen[i*len(keys)+j].Load()
			if s == 0 {
				r.missed++
				continue
			}
			if first == 0 || s < first {
				first = s
			}
			last = max(last, s)
		}
		if first != 0 {
			r.first = append(r.first, time.Unix(0, first).Sub(f.at))
			r.last = append(r.last, time.Unix(0, last).Sub(f.at))
		}
	}
	return r
}

// explain says what c knows of t that decides whether it probes t and
// what its View shows: the status applied, its owner, the lease, whether
// a handoff or a return leaves it to another, and the coverMemo.
func (c *Coordinator) explain(t health.Target) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var parts []string
	if r, ok := c.remote[t.Key]; ok {
		asOf, lapsed := c.asOf(r)
		parts = append(parts, fmt.Sprintf("status of %.8s at %v, %s, %v old, as of %v ago, lapsed %v, stale %q",
			r.Holder, r.Addr, r.State, time.Duration(c.now()-r.version)*time.Microsecond, time.Duration(c.now()-asOf)*time.Microsecond,
			lapsed, c.b.stale(r.Holder, c.ownerOf(t.Key), r.version, asOf, c.members, c.now(), c.b.cover())))
		parts = append(parts, fmt.Sprintf("its version %d, publish number %d", r.version, r.Seq))
		if f := c.feeds[r.Holder]; f != nil {
			parts = append(parts, fmt.Sprintf("its holder's feed: heard %d (raised by a message %v ago), pending %d, due %v, numbers %v, confirmed %v ago, seen %v ago, read again %v ago",
				f.got, time.Since(f.gotAt).Round(time.Millisecond), f.pending, f.due, f.numbers, time.Duration(c.now()-f.confirmed)*time.Microsecond, time.Since(f.seen).Round(time.Millisecond), time.Since(f.readAt).Round(time.Millisecond)))
		}
	} else {
		parts = append(parts, "no status")
	}
	if r, ok := c.remote[t.Key]; ok && r.Holder == c.Token() {
		parts = append(parts, fmt.Sprintf("this instance's last publish number %d, confirmed %d", c.leases.seq.Load(), c.leases.sent.Load()))
	}
	parts = append(parts, fmt.Sprintf("owner %.8s (me %v, live %v), held %v, mode %q, took first %v", c.ownerOf(t.Key), c.ownerOf(t.Key) == c.Token(), c.members[c.ownerOf(t.Key)], c.held[t.Key], c.mode, c.tookFirst))
	if until, ok := c.handoffs[t.Key]; ok {
		parts = append(parts, fmt.Sprintf("handoff for %v more", time.Until(until).Round(time.Millisecond)))
	}
	if o, ok := c.returnOwners[t.Key]; ok {
		parts = append(parts, fmt.Sprintf("left to %.8s after the return for %v more", o, time.Until(c.returnUntil).Round(time.Millisecond)))
	}
	if m, ok := c.covers[t.Key]; ok {
		parts = append(parts, fmt.Sprintf("memo current %v, until in %v, at %v", m.gen == c.coverGen, time.Duration(m.until-c.now())*time.Microsecond, m.addr))
	}
	if p, ok := c.own[t.Key]; ok {
		parts = append(parts, fmt.Sprintf("own %v %d/%d", p.Verdict.State, p.OK, p.Fail))
	}
	if kl, ok := c.kept[t.Key]; ok {
		parts = append(parts, fmt.Sprintf("lease extended %v ago, probed since %v, status stored %v ago", time.Since(kl.extended).Round(time.Millisecond), kl.probed, time.Since(kl.stored).Round(time.Millisecond)))
	}
	if w, ok := c.writing[t.Key]; ok {
		parts = append(parts, fmt.Sprintf("a write in flight (another waits: %v)", w.waits))
	}
	if p, ok := c.published[t.Key]; ok {
		parts = append(parts, fmt.Sprintf("published %v %d/%d, written since the take %v", p.Verdict.State, p.OK, p.Fail, c.writtenBy[t.Key]))
	}
	return strings.Join(parts, "; ")
}

// explain says where target i stands in c: on the wheel or not, its
// last tick's probe, its tracker.
func (c *simChecker) explain(i int32) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := c.ts[i]
	queued := slices.ContainsFunc(c.queue, func(w simWait) bool { return w.idx == i })
	return fmt.Sprintf("due in %v, busy %v (queued for the budget %v), probing %v, %v %d/%d, last probe %v ago",
		time.Duration(t.due-time.Now().UnixNano()).Round(time.Millisecond), t.busy, queued, t.probing, t.state, t.ok, t.fail,
		time.Since(time.Unix(0, t.last)).Round(time.Millisecond))
}
