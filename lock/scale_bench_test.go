package lock

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// The scale benchmark's interval: the health package's default, so that the
// figures are those of a fleet left at the defaults.
const scaleInterval = 2 * time.Second

// Defaults of the scale benchmark's environment (see BenchmarkScale).
const (
	scaleDefaultSizes      = "20x1000,100x1000"
	scaleDefaultWindow     = 20 * time.Second
	scaleDefaultFlips      = 3
	scaleDefaultSettle     = 90 * time.Second
	scaleDefaultStallSizes = "20x1000"
	scaleDefaultStalls     = "600ms,10s"
	scaleDefaultStallKinds = "pause,sigstop"
	// scaleFlipKeys is how many backends flip at once.
	scaleFlipKeys = 10
	// stallSteady is the steady state measured before each stall.
	stallSteady = 5 * scaleInterval
)

// BenchmarkScale runs fleets of coordinators at the scale the cluster
// mode promises ("hundreds of GSLB nodes monitoring thousands of
// backends") on one real redis-server, in this one process: each instance
// is a Coordinator with its own Redis client and a simulated checker
// (simChecker: what health.Checker does with its Shared, each probe's
// result read from a shared up/down state instead of a connection), for
// each size instances x backends, interval 2 s, timeout 500 ms, rise and
// fall 2. Once the fleet has settled (every instance coordinated, every
// lease held once, every View all Up, and an interval of one probe per
// backend), it measures a window of the steady state and reports:
//
//   - probes per backend per interval: the probe starts of all instances,
//     per backend and interval (1.00: exactly one prober), and their
//     spread over the backends (a backend probed twice an interval is
//     probed by two instances);
//   - Redis: commands/s (INFO commandstats: those its scripts run
//     included), and what the instances sent (commands, round trips);
//     CPU in cores (INFO cpu, user + system), per status write and per
//     backend per interval (a quiet status is written once per rewrite
//     period, its lease extended between);
//     memory (used_memory, RSS);
//   - each instance: the process's CPU (getrusage) and live heap after a
//     GC, divided by the instances (the simulated checkers included:
//     instances × backends Claims per interval, as the real checkers
//     make);
//   - flip spread: 10 backends stop, then start again, a few times; per
//     backend, from the flip to the first instance's View showing it,
//     and from the first instance's View to the last one's (p50, p99,
//     max); and what those figures passed through meanwhile: how long
//     this process's goroutines waited to run, the instances' Redis
//     calls as they saw them, and the commands that ran slowly inside
//     Redis (its slow log). Every instance here shares one scheduler and
//     one garbage collector, so a spread far above Redis's own times,
//     with waits like it, is this process's rather than the fleet's.
//
// b.N is ignored: one run is one measurement of minutes, so it runs only
// with -benchtime 1x (make bench's line), not under make bench's
// -bench . of every package:
//
//	go test -run '^$' -bench 'Scale$' -benchtime 1x -timeout 60m ./lock/
//
// The environment picks what runs:
//
//	SCALE_SIZES   instances x backends, comma-separated (default
//	              20x1000,100x1000); a full run names
//	              20x1000,100x1000,300x1000,20x10000,100x10000,300x10000
//	SCALE_WINDOW  the steady state measured (default 20s)
//	SCALE_FLIPS   rounds of 10 backends down and up again (default 3)
//	SCALE_SETTLE  how long a fleet may take to settle (default 90s); one
//	              that does not is measured all the same, and says so
//	SCALE_WAVES   grows the fleet in that many waves (default 1: every
//	              instance at once): the first wave is given the
//	              targets as the others are, each next one starts with
//	              them, once the fleet before it settled (a fleet scaled
//	              out in steps); each wave may take SCALE_SETTLE
//	SCALE_BUDGET  each instance's probe budget, probes a second, or off
//	              (default the plugin's with Redis: the larger of 200
//	              and backends / (2 x interval)), applied as health's
//	              ProbeBudget does
//	SCALE_CPUPROFILE  writes a CPU profile of the measurement window
//	              (go tool pprof) to that file: an instance's steady
//	              state, without the start-up
//	SCALE_STARTPROFILE  writes the start, until the fleet settled,
//	              to that file
//	SCALE_FLIPPROFILE  writes one of the flips to that file
//	              (and of both, the lock contention to that file.mutex
//	              and the live heap at the end to that file.heap)
//	SCALE_REDIS_NICE  runs redis-server at that nice value (-15: ahead
//	              of this process), as the fleet these coordinators
//	              stand for runs Redis on a machine of its own (on 2
//	              cores, 100 coordinators starting together starve a
//	              Redis at their priority, and it settles with -15)
//
// On a shared 2-core machine the default sizes take about 5 minutes
// (20x1000 one, 100x1000 four: a fleet that does not settle waits out
// SCALE_SETTLE and each flip's wait), the default stalls 3 more; the
// full set of sizes about 50 minutes (300x10000 alone 29, with 5 GB of
// heap: give -timeout 150m, and GOMEMLIMIT). The full set needs the
// machine to itself: at 10,000 backends 300 instances' checkers ask 1.5
// million Claims a second, which one process on 2 cores cannot give; the
// report's PING times and the lateness of the simulated checks say when
// the process, not Redis, was the limit.
//
// BenchmarkScaleStall is the second mode.
func BenchmarkScale(b *testing.B) {
	oneShot(b)
	sizes := envSizes(b, "SCALE_SIZES", scaleDefaultSizes)
	window := envDuration(b, "SCALE_WINDOW", scaleDefaultWindow)
	flips := envInt(b, "SCALE_FLIPS", scaleDefaultFlips)
	settle := envDuration(b, "SCALE_SETTLE", scaleDefaultSettle)
	for _, sz := range sizes {
		b.Run(sz.String(), func(b *testing.B) { benchScale(b, sz, window, flips, settle) })
	}
}

// BenchmarkScaleStall stalls the Redis of a settled fleet in the middle of
// its run, for each duration and each kind of stall: "pause" (CLIENT
// PAUSE <ms> ALL: Redis holds every command) and "sigstop" (SIGSTOP, then
// SIGCONT: Redis answers nothing, not even pings). It counts probe starts
// in 100 ms buckets and reports the peak against the steady state (the 10
// s before the stall), how many instances went local (Observer.Mode), how
// long after Redis returned the fleet came back to one prober per backend
// (from then on, every interval's window holds at most 1.05 probes per
// backend), and the largest bucket on the way back. Each stall runs on a
// fleet of its own.
//
//	go test -run '^$' -bench ScaleStall -benchtime 1x -timeout 60m ./lock/
//
// The environment picks what runs (BenchmarkScale's SCALE_SETTLE and
// SCALE_BUDGET too):
//
//	SCALE_STALL_SIZES  instances x backends (default 20x1000)
//	SCALE_STALLS       how long Redis stalls (default 600ms,10s; a full
//	                   run adds 2s)
//	SCALE_STALL_KINDS  pause, sigstop or both (default both)
func BenchmarkScaleStall(b *testing.B) {
	oneShot(b)
	sizes := envSizes(b, "SCALE_STALL_SIZES", scaleDefaultStallSizes)
	settle := envDuration(b, "SCALE_SETTLE", scaleDefaultSettle)
	var stalls []time.Duration
	for _, s := range envList("SCALE_STALLS", scaleDefaultStalls) {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			b.Fatalf("SCALE_STALLS: %q is not a positive duration", s)
		}
		stalls = append(stalls, d)
	}
	kinds := envList("SCALE_STALL_KINDS", scaleDefaultStallKinds)
	for _, k := range kinds {
		if k != "pause" && k != "sigstop" {
			b.Fatalf("SCALE_STALL_KINDS: %q is neither pause nor sigstop", k)
		}
	}
	for _, sz := range sizes {
		for _, k := range kinds {
			for _, d := range stalls {
				b.Run(fmt.Sprintf("%v/%s/%v", sz, k, d), func(b *testing.B) { benchStall(b, sz, k, d, settle) })
			}
		}
	}
}

// windowProfile writes a CPU profile, from now until stop, to the file
// the environment variable env names, if any: where the work of one part
// of the run goes (SCALE_CPUPROFILE: the measurement window, an
// instance's steady state, without the start-up's; SCALE_FLIPPROFILE:
// the flips).
func windowProfile(b *testing.B, env string) (stop func()) {
	name := os.Getenv(env)
	if name == "" {
		return func() {}
	}
	f, err := os.Create(name)
	if err != nil {
		b.Fatalf("%s: %v", env, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		b.Fatalf("%s: %v", env, err)
	}
	// And where goroutines waited for each other's locks meanwhile, to
	// name.mutex: what a status waits for on its way to the View is not
	// CPU.
	runtime.SetMutexProfileFraction(1)
	return func() {
		pprof.StopCPUProfile()
		f.Close()
		runtime.SetMutexProfileFraction(0)
		if m, err := os.Create(name + ".mutex"); err == nil {
			pprof.Lookup("mutex").WriteTo(m, 0)
			m.Close()
		}
		// And what the heap held at the end: a fleet that does not
		// settle holds several times its settled heap an instance.
		runtime.GC()
		if h, err := os.Create(name + ".heap"); err == nil {
			pprof.Lookup("heap").WriteTo(h, 0)
			h.Close()
		}
	}
}

// oneShot skips a benchmark of minutes unless -benchtime is 1x.
func oneShot(b *testing.B) {
	if f := flag.Lookup("test.benchtime"); f == nil || f.Value.String() != "1x" {
		b.Skip("one measurement of minutes: run it with -benchtime 1x (make bench does)")
	}
}

// scaleSize is a fleet's size.
type scaleSize struct{ instances, backends int }

func (s scaleSize) String() string { return fmt.Sprintf("%dx%d", s.instances, s.backends) }

func envList(name, def string) []string {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func envSizes(b *testing.B, name, def string) []scaleSize {
	var out []scaleSize
	for _, s := range envList(name, def) {
		i, m, ok := strings.Cut(s, "x")
		n, err1 := strconv.Atoi(i)
		k, err2 := strconv.Atoi(m)
		if !ok || err1 != nil || err2 != nil || n < 1 || k < 1 {
			b.Fatalf("%s: %q is not instances x backends (20x1000)", name, s)
		}
		out = append(out, scaleSize{n, k})
	}
	return out
}

// envBudget is each instance's probe budget: SCALE_BUDGET, a rate or
// "off", or by default the plugin's with Redis (probeBudgetFor): the
// larger of 200 and half the backends' probes a second.
func envBudget(b *testing.B, backends int) float64 {
	switch v := os.Getenv("SCALE_BUDGET"); v {
	case "":
		return max(200, float64(backends)/(2*scaleInterval.Seconds()))
	case "off":
		return 0
	default:
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || !(r >= 0) || math.IsInf(r, 1) {
			b.Fatalf("SCALE_BUDGET: %q is neither a rate (probes a second) nor off", v)
		}
		return r
	}
}

func budgetString(r float64) string {
	if r == 0 {
		return "off"
	}
	return fmt.Sprintf("%.0f/s", r)
}

func envDuration(b *testing.B, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		b.Fatalf("%s: %q is not a positive duration", name, v)
	}
	return d
}

func envInt(b testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		b.Fatalf("%s: %q is not a count", name, v)
	}
	return n
}

// scaleSnap is what is counted at one moment of a run.
type scaleSnap struct {
	at                   time.Time
	redis                redisStats
	cpu                  time.Duration
	writes, published    int64
	sent, trips, resyncs int64
	views                int64
	perTarget            []int32
	load                 string // the machine's load average
}

func (fl *scaleFleet) snap(b *testing.B) scaleSnap {
	rs, err := readRedisStats(context.Background(), fl.admin)
	if err != nil {
		// A Redis that does not answer INFO within its minute is a
		// figure too: those of Redis are then missing.
		fmt.Printf("scale: Redis did not answer INFO: %v\n", err)
	}
	s := scaleSnap{at: time.Now(), redis: rs, cpu: processCPU(), writes: fl.writes.Load(), published: fl.published.Load(),
		sent: fl.sent.Load(), trips: fl.trips.Load(), resyncs: fl.resyncs.Load(), views: fl.views.Load(), perTarget: make([]int32, len(fl.perTarget)), load: loadAverage()}
	for i := range fl.perTarget {
		s.perTarget[i] = fl.perTarget[i].Load()
	}
	return s
}

func benchScale(b *testing.B, sz scaleSize, window time.Duration, flips int, settleMax time.Duration) {
	n, m := sz.instances, sz.backends
	budget := envBudget(b, m)
	waves := max(1, min(envInt(b, "SCALE_WAVES", 1), n))
	stopStart := windowProfile(b, "SCALE_STARTPROFILE")
	say := scaleSay(sz.String())
	fl := startScaleFleet(b, n-(waves-1)*(n/waves), m, scaleInterval, budget)
	took, why := fl.settle(settleMax)
	for w := 1; w < waves && why == ""; w++ {
		say("wave %d of %d: %d instances settled %v after the targets came", w, waves, len(fl.ins), took.Round(100*time.Millisecond))
		from := time.Now()
		fl.grow(n / waves)
		_, why = fl.settle(settleMax)
		took = time.Since(from)
	}
	stopStart()
	n = len(fl.ins) // fewer when a wave did not settle: the rest were not added
	grown := ""
	if waves > 1 {
		grown = fmt.Sprintf(" (grown in %d waves: the last %d instances added to %d)", waves, n/waves, n-n/waves)
	}
	if why == "" {
		say("%d instances x %d backends, interval %v, probe budget %s: settled %v after the targets came%s", n, m, scaleInterval, budgetString(budget), took.Round(100*time.Millisecond), grown)
	} else {
		if n < sz.instances {
			grown = fmt.Sprintf(" (grown in %d waves, stopped at %d of %d instances)", waves, n, sz.instances)
		}
		say("%d instances x %d backends, interval %v, probe budget %s: NOT SETTLED after %v (%s), measured all the same%s", n, m, scaleInterval, budgetString(budget), settleMax, why, grown)
	}
	locals := fl.wentLocal(time.Time{})

	from := fl.snap(b)
	delayed := fl.delayed.Load()
	fl.lateness()
	stopProfile := windowProfile(b, "SCALE_CPUPROFILE")
	time.Sleep(window) // the measurement window
	stopProfile()
	late := fl.lateness()
	to := fl.snap(b)
	inWindow := fl.wentLocal(from.at)
	secs := to.at.Sub(from.at).Seconds()
	intervals := to.at.Sub(from.at).Seconds() / scaleInterval.Seconds()

	// Probes: per backend per interval, overall and per backend.
	perBackend := make([]float64, m)
	total := 0.0
	for i := range perBackend {
		d := float64(to.perTarget[i] - from.perTarget[i])
		perBackend[i] = d / intervals
		total += d
	}
	slices.Sort(perBackend)
	ppi := total / float64(m) / intervals
	buckets := fl.probes(from.at.Add(probeBucket), to.at)
	say("  probes per backend per interval %.3f (per backend: min %.2f, p50 %.2f, p99 %.2f, max %.2f); probe starts per %v: mean %.0f, max %d; %d waited for the probe budget",
		ppi, perBackend[0], quantile(perBackend, 0.5), quantile(perBackend, 0.99), perBackend[m-1], probeBucket, mean(buckets), slices.Max(buckets), fl.delayed.Load()-delayed)

	// Redis.
	cmds, cmdTotal := rates(from.redis, to.redis)
	writes := float64(to.writes - from.writes)
	redisCores := (to.redis.cpu - from.redis.cpu) / secs
	if from.redis.ok && to.redis.ok {
		mt := float64(m) / scaleInterval.Seconds()
		var top []string
		for _, c := range cmds[:min(6, len(cmds))] {
			top = append(top, fmt.Sprintf("%s %s", c.name, thousands(c.rate)))
		}
		say("Redis: %s commands/s (%.1f x M/T = %s; scripts' commands included: %s), for %s status writes/s (%s published/s)",
			thousands(cmdTotal), cmdTotal/mt, thousands(mt), strings.Join(top, ", "), thousands(writes/secs), thousands(float64(to.published-from.published)/secs))
		perWrite := 0.0
		if writes > 0 {
			perWrite = (to.redis.cpu - from.redis.cpu) / writes * 1e6
		}
		// A quiet status is written once per rewrite period, its lease
		// extended between: per status write, Redis's CPU counts those
		// extensions too; per backend per interval, it is what M/T
		// writes would each have to cost.
		say("Redis CPU %.3f core (%.1f µs per status write, %.1f µs per backend per interval), memory %.1f MB used, %.1f MB RSS",
			redisCores, perWrite, redisCores/mt*1e6, mb(to.redis.mem), mb(to.redis.rss))
		b.ReportMetric(cmdTotal, "redis-cmds/s")
		b.ReportMetric(redisCores, "redis-cores")
		b.ReportMetric(mb(to.redis.rss), "redis-MB")
	} else {
		say("Redis: NO FIGURES, it did not answer INFO within a minute; %s status writes/s", thousands(writes/secs))
	}
	say("the instances sent %s commands/s in %s round trips/s; %.1f resyncs per instance; %.2f Views made per instance per second",
		thousands(float64(to.sent-from.sent)/secs), thousands(float64(to.trips-from.trips)/secs), float64(to.resyncs-from.resyncs)/float64(n), float64(to.views-from.views)/secs/float64(n))

	pings := fl.pings(from.at, to.at)
	say("  Redis PING from the harness every %v: p50 %v, p99 %v, max %v; simulated checks ran at most %v late; load average %s, then %s",
		probeBucket, quantile(pings, 0.5).Round(10*time.Microsecond), quantile(pings, 0.99).Round(10*time.Microsecond), quantile(pings, 1).Round(10*time.Microsecond),
		late.Round(time.Millisecond), from.load, to.load)

	// Each instance: the process's CPU over the window, its heap after it.
	procCores := (to.cpu - from.cpu).Seconds() / secs
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	harness := float64(m) * float64(unsafe.Sizeof(simTarget{})+unsafe.Sizeof(simEntry{}))
	say("  each instance: %.4f core (the process %.2f cores / %d), heap %.2f MB (the process %.0f MB live / %d, of which the simulated checker %.2f MB); process RSS %.0f MB",
		procCores/float64(n), procCores, n, mb(int64(ms.HeapAlloc))/float64(n), mb(int64(ms.HeapAlloc)), n, harness/(1<<20), mb(processRSS()))

	// Flip spread.
	var spread, all, first []time.Duration
	missed := 0
	rng := rand.New(rand.NewPCG(uint64(n), uint64(m)))
	flipWait := time.Duration(scaleFall+scaleRise)*scaleInterval + 10*time.Second
	slowErr := slowRedis(context.Background(), fl.admin)
	views := fl.views.Load()
	stopFlipProfile := windowProfile(b, "SCALE_FLIPPROFILE")
	for range flips {
		keys := make([]int32, 0, scaleFlipKeys)
		for _, k := range rng.Perm(m)[:min(scaleFlipKeys, m)] {
			keys = append(keys, int32(k))
		}
		for _, up := range []bool{false, true} {
			r := fl.flipBackends(keys, up, flipWait)
			missed += r.missed
			for j := range r.first {
				first = append(first, r.first[j])
				all = append(all, r.last[j])
				spread = append(spread, r.last[j]-r.first[j])
			}
		}
	}
	stopFlipProfile()
	if len(spread) > 0 {
		slices.Sort(spread)
		slices.Sort(all)
		slices.Sort(first)
		say("  flip spread (%d flips of %d backends down and up): first to last instance p50 %v, p90 %v, p99 %v, max %v; flip to the first instance p50 %v, max %v; to every instance p50 %v, p99 %v, max %v",
			flips, scaleFlipKeys, ms3(quantile(spread, 0.5)), ms3(quantile(spread, 0.9)), ms3(quantile(spread, 0.99)), ms3(spread[len(spread)-1]),
			ms3(quantile(first, 0.5)), ms3(first[len(first)-1]), ms3(quantile(all, 0.5)), ms3(quantile(all, 0.99)), ms3(all[len(all)-1]))
		b.ReportMetric(float64(quantile(spread, 0.99))/float64(time.Millisecond), "flip-spread-p99-ms")
		say("  during the flips: %.1f Views made per instance per flip of a backend (each a copy of all %d entries)",
			float64(fl.views.Load()-views)/float64(n)/float64(2*flips*min(scaleFlipKeys, m)), m)
		fl.flipCauses(say, slowErr)
	}
	if missed > 0 {
		say("  flip: %d (backend, instance) pairs did not show the flip within %v", missed, flipWait)
	}
	if l := fl.wentLocal(time.Time{}); l > 0 {
		say("  instances that went local: %d while settling, %d in the window, %d in the whole run", locals, inWindow, l)
	}
	for _, l := range fl.logs.summary() {
		say("  log %s", l)
	}
	b.ReportMetric(ppi, "probes/backend/interval")
	b.ReportMetric(procCores/float64(n), "cores/instance")
	b.ReportMetric(mb(int64(ms.HeapAlloc))/float64(n), "MB/instance")
}

// flipCauses says what the flips' figures passed through while they were
// measured: how long this process's goroutines waited to run, how long
// the instances' Redis calls took as they saw them, and how many commands
// ran slowly inside Redis. A spread far above Redis's own times, with
// calls and waits like it, is this one process's (its scheduler and
// garbage collector shared by every instance), not the fleet's.
func (fl *scaleFleet) flipCauses(say func(string, ...any), slowErr error) {
	calls := fl.flipCalls.sorted()
	proc := fl.flipProc.counts()
	w50, waits := proc.waited(0.5)
	w99, _ := proc.waited(0.99)
	w999, _ := proc.waited(0.999)
	wmax, _ := proc.waited(1)
	var slow string
	n, longest, err := 0, time.Duration(0), slowErr
	if err == nil {
		n, longest, err = slowCommands(context.Background(), fl.admin)
	}
	if err != nil {
		slow = "Redis's slow log: " + err.Error()
	} else {
		slow = fmt.Sprintf("%d commands ran over %v inside Redis (the longest %v)", n, slowCommand, longest.Round(10*time.Microsecond))
	}
	if len(calls) == 0 {
		say("  during the flips: no Redis call of the instances timed; %s", slow)
		return
	}
	if prop := fl.flipProp.sorted(); len(prop) > 0 {
		say("  during the flips: %d statuses went from their holder's write to an instance, p50 %v, p99 %v, max %v",
			len(prop), quantile(prop, 0.5).Round(10*time.Microsecond), ms3(quantile(prop, 0.99)), ms3(prop[len(prop)-1]))
	}
	say("  during the flips: this process's goroutines waited to run p50 %s, p99 %s, p99.9 %s, max %s (%d waits sampled, /sched/latencies), through %d collections of its heap (%.0f MB allocated); the instances' %d Redis calls took, as they saw them, p50 %v, p99 %v, max %v; %s",
		waited(w50), waited(w99), waited(w999), waited(wmax), waits, proc.cycles, mb(int64(proc.allocated)), len(calls), quantile(calls, 0.5).Round(10*time.Microsecond), ms3(quantile(calls, 0.99)), ms3(calls[len(calls)-1]), slow)
}

// waited formats a bound of /sched/latencies, whose lowest buckets are
// below what a scheduler wait can be told apart from none.
func waited(d time.Duration) string {
	if d < 10*time.Microsecond {
		return "<10µs"
	}
	return d.String()
}

// wentLocal counts the instances that went local since from.
func (fl *scaleFleet) wentLocal(from time.Time) int {
	n := 0
	for _, in := range fl.ins {
		if slices.ContainsFunc(in.changes(), func(c modeChange) bool { return c.mode == ModeLocal && !c.at.Before(from) }) {
			n++
		}
	}
	return n
}

func benchStall(b *testing.B, sz scaleSize, kind string, d, settleMax time.Duration) {
	n, m := sz.instances, sz.backends
	budget := envBudget(b, m)
	fl := startScaleFleet(b, n, m, scaleInterval, budget)
	say := scaleSay(fmt.Sprintf("%v %s %v", sz, kind, d))
	if _, why := fl.settle(settleMax); why != "" {
		say("%d instances x %d backends: NOT SETTLED after %v (%s), measured all the same", n, m, settleMax, why)
	}
	time.Sleep(stallSteady) // the steady state measured
	t0 := time.Now()
	steady := fl.probes(t0.Add(-stallSteady), t0)
	delayed := fl.delayed.Load()
	fl.waitMax.Store(0)
	// Backends stopped as the stall begins, to judge the answers by.
	rng := rand.New(rand.NewPCG(uint64(n), uint64(m)))
	stopped := make([]int32, 0, scaleFlipKeys)
	for _, k := range rng.Perm(m)[:min(scaleFlipKeys, m)] {
		stopped = append(stopped, int32(k))
	}
	judge := fl.stopForJudge(stopped)
	var back time.Time
	switch kind {
	case "pause":
		if err := fl.admin.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err != nil {
			b.Fatal(err)
		}
		back = t0.Add(d)
	case "sigstop":
		if err := fl.srv.Freeze(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(d) // the stall
		if err := fl.srv.Thaw(); err != nil {
			b.Fatal(err)
		}
		back = time.Now()
	}
	// Watch until three intervals after Redis returned, and until every
	// instance coordinates with one prober per backend again (at most two
	// minutes more).
	limit := m * 105 / 100
	recovered := fl.poll(3*scaleInterval+d+2*time.Minute, func() bool {
		if time.Since(back) < 3*scaleInterval {
			return false
		}
		for _, in := range fl.ins {
			if in.coord.Mode() != ModeCoordinated {
				return false
			}
		}
		return fl.lastInterval() <= limit
	})
	fl.judge.Store(nil)
	end := time.Now().Add(-probeBucket)
	during := fl.probes(t0, end)
	after := fl.probes(back, end)

	// From when on every interval's window after the return held at most
	// 1.05 probes per backend.
	per := int(scaleInterval / probeBucket)
	again := -1
	for s := len(after) - per; s >= 0; s-- {
		sum := 0
		for _, c := range after[s : s+per] {
			sum += c
		}
		if sum > limit {
			break
		}
		again = s
	}

	steadyMean, steadyMax := mean(steady), slices.Max(steady)
	peak := slices.Max(during)
	burst := slices.Max(after)
	say("%d instances x %d backends, interval %v, probe budget %s: Redis stalled by %s for %v (load average %s)", n, m, scaleInterval, budgetString(budget), kind, d, loadAverage())
	say("  probe starts per %v: steady state (the %v before) %.0f mean, %d max; peak %d (%.2f x the steady mean, %.2f x its max) %v after the stall began; on the way back at most %d (%.2f x the steady mean, %.2f x its max); every instance probing every backend would be %d",
		probeBucket, stallSteady, steadyMean, steadyMax, peak, float64(peak)/steadyMean, float64(peak)/float64(steadyMax),
		(time.Duration(slices.Index(during, peak)) * probeBucket).Round(probeBucket),
		burst, float64(burst)/steadyMean, float64(burst)/float64(steadyMax), n*m*int(probeBucket)/int(scaleInterval))
	if budget > 0 {
		// The budget is a rate: a 100 ms bucket may hold a little more
		// when probes start in batches; a second may not.
		per := int(time.Second / probeBucket)
		most := 0
		for i := 0; i+per <= len(during); i++ {
			sum := 0
			for _, c := range during[i : i+per] {
				sum += c
			}
			most = max(most, sum)
		}
		say("  busiest second from the stall on: %d probe starts, against the budget x instances %.0f (%.3f x)", most, budget*float64(n), float64(most)/(budget*float64(n)))
		b.ReportMetric(float64(most)/(budget*float64(n)), "peak-second/budget")
	}
	went, firstLocal, lastLocal, lastBack := 0, time.Duration(0), time.Duration(0), time.Duration(0)
	for _, in := range fl.ins {
		local := false
		for _, c := range in.changes() {
			switch {
			case c.at.Before(t0):
			case c.mode == ModeLocal:
				if !local {
					at := c.at.Sub(t0)
					if went == 0 || at < firstLocal {
						firstLocal = at
					}
					lastLocal = max(lastLocal, at)
					went++
				}
				local = true
			case c.mode == ModeCoordinated && local:
				lastBack = max(lastBack, c.at.Sub(back))
			}
		}
	}
	if went > 0 {
		say("  %d of %d instances went local, %v to %v after the stall began; the last one coordinating again %v after Redis returned",
			went, n, firstLocal.Round(time.Millisecond), lastLocal.Round(time.Millisecond), lastBack.Round(time.Millisecond))
		// Until an instance hears Redis again it probes every backend
		// as in local mode; from when the last one did, the way back
		// is the rejoin's own. The bucket in which it did still holds
		// local mode's probes from before: the rejoin's are counted
		// from the next.
		if rest := fl.probes(back.Add(lastBack), end); len(rest) > 1 {
			most := slices.Max(rest[1:])
			say("  from when the last instance coordinated again: %d in that %v (local mode's probes until then included), then at most %d per %v (%.2f x the steady mean, %.2f x its max)",
				rest[0], probeBucket, most, probeBucket, float64(most)/steadyMean, float64(most)/float64(steadyMax))
			b.ReportMetric(float64(most)/steadyMean, "rejoined-burst/steady-mean")
		}
	} else {
		say("  no instance went local")
	}
	switch {
	case again >= 0 && recovered:
		say("  one prober per backend again %v after Redis returned (every later %v window at most %d probes)", time.Duration(again)*probeBucket, scaleInterval, limit)
	default:
		say("  NOT back to one prober per backend %v after Redis returned", end.Sub(back).Round(time.Second))
	}
	if d := fl.delayed.Load() - delayed; d > 0 {
		say("  %d probes waited for the probe budget, the longest %v", d, time.Duration(fl.waitMax.Load()).Round(time.Millisecond))
	}
	judgeStall(b, fl, judge, d, budget, say)
	say("  probe starts per %v from the stall on: %v", probeBucket, during)
	for _, l := range fl.logs.summary() {
		say("  log %s", l)
	}
	b.ReportMetric(float64(peak)/steadyMean, "peak/steady-mean")
	b.ReportMetric(float64(peak)/float64(steadyMax), "peak/steady-max")
	b.ReportMetric(float64(burst)/steadyMean, "back-burst/steady-mean")
	b.ReportMetric(float64(went), "instances-local")
	if again >= 0 {
		b.ReportMetric((time.Duration(again) * probeBucket).Seconds(), "s-to-one-prober")
	}
}

// judgeStall reports how the instances' answers followed the backends
// stopped as a stall of d began: when each instance's View showed each of
// them Down, against the bound of local mode (fall x max(interval,
// backends / budget) + the stall), and any View that showed a backend
// wrong after that, or an up backend Down.
func judgeStall(b *testing.B, fl *scaleFleet, j *scaleJudge, d time.Duration, budget float64, say func(string, ...any)) {
	cycle := fl.interval
	if budget > 0 {
		cycle = max(cycle, time.Duration(float64(len(fl.targets))/budget*float64(time.Second)))
	}
	bound := time.Duration(fl.fall)*cycle + d
	var took []time.Duration
	never, late := 0, 0
	for i := range j.down {
		at := j.down[i].Load()
		if at == 0 {
			never++
			continue
		}
		t := time.Unix(0, at).Sub(j.at)
		took = append(took, t)
		if t > bound {
			late++
		}
	}
	slices.Sort(took)
	if len(took) > 0 {
		say("  %d backends stopped as the stall began: shown Down by every instance after p50 %v, max %v (bound fall x max(interval, backends/budget) + the stall = %v); %d of %d (instance, backend) pairs later than the bound, %d never",
			len(j.keys), ms3(quantile(took, 0.5)), ms3(took[len(took)-1]), bound, late, len(j.down), never)
		b.ReportMetric(took[len(took)-1].Seconds(), "s-stopped-backend-down-max")
	} else {
		say("  %d backends stopped as the stall began: NO instance showed one Down", len(j.keys))
	}
	say("  wrong answers meanwhile: %d Views showed a stopped backend Up again after Down; %d times an up backend was shown Down", j.upAgain.Load(), j.wrongDown.Load())
	if e := j.example.Load(); e != nil {
		say("  for example: %s", *e)
	}
	b.ReportMetric(float64(late+never), "stopped-backends-late")
	b.ReportMetric(float64(j.upAgain.Load()+j.wrongDown.Load()), "wrong-views")
}

// scaleSay returns a function that prints a line of the report of run on
// stdout at once: the benchmark's own log would keep ten lines, and only
// at the end.
func scaleSay(run string) func(format string, args ...any) {
	return func(format string, args ...any) {
		fmt.Printf("scale %s: %s\n", run, strings.TrimLeft(fmt.Sprintf(format, args...), " "))
	}
}

// quantile returns the q-quantile of sorted.
func quantile[T int | float64 | time.Duration](sorted []T, q float64) T {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(int(q*float64(len(sorted))), len(sorted)-1)]
}

func mean(xs []int) float64 {
	if len(xs) == 0 {
		return 0
	}
	sum := 0
	for _, x := range xs {
		sum += x
	}
	return float64(sum) / float64(len(xs))
}

func mb(bytes int64) float64 { return float64(bytes) / (1 << 20) }

func ms3(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

// thousands formats x rounded, with thousands separated by commas.
func thousands(x float64) string {
	s := strconv.FormatInt(int64(x+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
