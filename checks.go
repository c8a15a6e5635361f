package pgcluster

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/rediserr"
	"github.com/pgcluster/pgcluster/lock"
)

// checks are an instance's active health checks, made (newChecks) but not
// started: setTargets is the sink the publisher hands the nodes to check
// to, start runs them and passes their Views to the publisher. With
// redis, a lock.Coordinator shares the checks with the fleet: it tells the
// checker which nodes to probe, and its View (this instance's verdicts and
// the holders') is the one answered from. The Views go through a handover
// (checks_handover.go): after a Corefile reload, the verdicts of the
// instance replaced stand in until this one's own have judged each node.
type checks struct {
	cfg *settings
	h   *handover
	// c probes; nil for a passive instance (check passive).
	c *health.Checker
	// coord and rdb are the fleet's, with redis; nil without. With
	// check_scope zone or region, coord is this instance's segment's.
	coord *lock.Coordinator
	rdb   redis.UniversalClient
	// sg, with check_scope zone or region, answers each segment's
	// clients with its verdicts; the segments it follows are under fmu.
	sg      *segmentation
	fmu     sync.Mutex
	ctx     context.Context // of start: the followed segments' too
	wg      sync.WaitGroup  // the followed segments' coordinators
	targets []health.Target
	follows []*lock.Coordinator
	stopped bool // the checks stopped: no segment is followed any more
}

// newChecks makes the health checks of cfg.
func newChecks(cfg *settings) (*checks, error) {
	zone := cfg.zones[0]
	var segProbes prometheus.Counter
	if cfg.segmented() {
		segProbes = segmentProbes.WithLabelValues(zone, cfg.home())
	}
	hc := cfg.healthConfig(func(check, cause string, d time.Duration) {
		probes.WithLabelValues(zone, check, cause).Inc()
		probeDuration.WithLabelValues(zone, check).Observe(d.Seconds())
		if segProbes != nil {
			segProbes.Inc()
		}
	})
	sessions := checkSessions.WithLabelValues(zone)
	hc.ObserveSession = func(delta int) { sessions.Add(float64(delta)) }
	delayed := probesDelayed.WithLabelValues(zone)
	hc.ObserveBudget = func(time.Duration) { delayed.Inc() }
	hc.ProbeBudget = cfg.probeBudgetFor(0)
	ch := &checks{cfg: cfg, h: newHandover(handoverKey(cfg))}
	if cfg.redisURL == "" {
		c, err := health.New(hc)
		if err != nil {
			return nil, err
		}
		ch.c = c
		return ch, nil
	}

	rdb, err := newRedisClient(cfg.redisURL)
	if err != nil {
		return nil, err
	}
	coord, err := lock.NewCoordinator(rdb, cfg.lockConfig(cfg.home(), cfg.passive, redisLogf(rediserr.Watch(rdb)), fleetObserver{zone}))
	if err != nil {
		rdb.Close()
		return nil, err
	}
	ch.coord, ch.rdb = coord, rdb
	if cfg.passive {
		// No checker: nothing here ever probes a node.
		return ch, nil
	}
	hc.Shared = coord
	c, err := health.New(hc)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	coord.SetProbeNow(c.ProbeNow)
	coord.SetProbeAtPhase(c.ProbeAtPhase)
	coord.SetRecheck(c.Recheck, c.RecheckAll)
	ch.c = c
	return ch, nil
}

// lockConfig is the coordinator's configuration for segment seg ("": the
// fleet's), passive or probing.
func (s *settings) lockConfig(seg string, passive bool, logf func(string, ...any), o lock.Observer) lock.Config {
	return lock.Config{
		Prefix:   s.segmentPrefix(seg),
		Segment:  seg,
		Passive:  passive,
		Interval: s.interval,
		Timeout:  s.timeout,
		Secret:   s.redisSecret,
		Token:    s.token,
		Name:     s.instance,
		WAL:      s.judgesLag(),
		Logf:     logf,
		Observer: o,
	}
}

// follow starts following the verdicts of segment seg, passing each View
// to apply, until the checks stop or stop is called; it returns the count
// of the segment's live probers, and whether Redis answers (see probers).
func (ch *checks) follow(seg string, apply func(health.View)) (func() (int, bool), func()) {
	logf := redisLogf(rediserr.Watch(ch.rdb))
	cfg := ch.cfg.lockConfig(seg, true, func(format string, args ...any) { logf(seg+": "+format, args...) }, nil)
	// Redis answers, or does not: the home coordinator says so, once for
	// every segment (see segmentation.mix).
	cfg.QuietModes = true
	coord, err := lock.NewCoordinator(ch.rdb, cfg)
	if err != nil {
		// The fleet's options made the home coordinator: only a bug gets here.
		log.Errorf("Health checks: cannot follow %s: %v", seg, err)
		return func() (int, bool) { return 0, false }, func() {}
	}
	ch.fmu.Lock()
	defer ch.fmu.Unlock()
	if ch.ctx == nil || ch.stopped {
		return func() (int, bool) { return 0, false }, func() {}
	}
	coord.SetTargets(ch.targets)
	ch.follows = append(ch.follows, coord)
	ctx, cancel := context.WithCancel(ch.ctx)
	ch.wg.Go(func() { coord.Run(ctx, apply) })
	stop := func() {
		cancel()
		ch.fmu.Lock()
		defer ch.fmu.Unlock()
		ch.follows = slices.DeleteFunc(ch.follows, func(c *lock.Coordinator) bool { return c == coord })
	}
	return probers(coord), stop
}

// passiveVerdicts says, for a passive instance of check_scope fleet, whose
// verdicts it answers with: the fleet's as read now ("own"), or the last
// read while Redis does not answer ("last").
func (ch *checks) passiveVerdicts() string {
	if ch.coord.Mode() == lock.ModeCoordinated {
		return usingOwn
	}
	return usingLast
}

// probers is a coordinator's count of live probers and whether Redis
// answers it (a count of none is then news: nobody probes there).
func probers(c *lock.Coordinator) func() (int, bool) {
	return func() (int, bool) { return c.Members(), c.Mode() == lock.ModeCoordinated }
}

// waitView reports whether the first snapshot waits for the first View:
// with a fleet, an instance answers only once the fleet's statuses are
// read, or with the verdicts of the instance this one replaces (a Corefile
// reload).
func (ch *checks) waitView() bool { return ch.coord != nil }

// setTargets hands the nodes to check to the handover, the coordinator and
// the checker.
func (ch *checks) setTargets(ts []health.Target) {
	ch.h.setTargets(ts)
	if ch.coord != nil {
		ch.coord.SetTargets(ts)
	}
	ch.fmu.Lock()
	ch.targets = ts
	for _, f := range ch.follows {
		f.SetTargets(ts)
	}
	ch.fmu.Unlock()
	if ch.c == nil {
		return
	}
	ch.c.SetProbeBudget(ch.cfg.probeBudgetFor(len(ts)))
	ch.c.SetTargets(ts)
}

// start runs the checks until ctx is done, passing their Views to publish.
// When the instance before this one handed verdicts over, publish has been
// called with them before start returns. It returns a channel closed when
// the checks have stopped, after ctx is done, with every probe's socket
// closed and, with redis, the leases released.
func (ch *checks) start(ctx context.Context, publish func(health.View)) <-chan struct{} {
	done := make(chan struct{})
	if ch.coord == nil {
		ch.h.start(ctx, publish, carryFor(ch.cfg))
		go func() {
			defer close(done)
			ch.c.Run(ctx, ch.h.setView)
		}()
		return done
	}
	zone := ch.cfg.zones[0]
	// The token names this instance in Redis (leases, statuses,
	// pgclusterctl status): say which host it is.
	redisMember.DeletePartialMatch(prometheus.Labels{"zone": zone})
	redisMember.WithLabelValues(zone, ch.coord.Token()).Set(1)
	switch {
	case ch.cfg.passive:
		log.Infof("Redis: this instance (%s) probes nothing and answers from the verdicts of the fleet's probing instances (check passive)", ch.cfg.instance)
	case ch.cfg.segmented():
		log.Infof("Redis: this instance is member %s (%s) of %s's probers; its full token is %s", short(ch.coord.Token()), ch.cfg.instance, ch.cfg.home(), ch.coord.Token())
	default:
		log.Infof("Redis: this instance is fleet member %s (%s); its full token is %s", short(ch.coord.Token()), ch.cfg.instance, ch.coord.Token())
	}
	ch.fmu.Lock()
	ch.ctx = ctx
	ch.fmu.Unlock()
	if ch.sg != nil {
		publish = ch.sg.setHome
		if ch.c == nil {
			ch.sg.homeMembers = probers(ch.coord)
		}
	}
	ch.h.start(ctx, publish, carryFor(ch.cfg))
	var wg sync.WaitGroup
	if ch.c != nil {
		wg.Go(func() { ch.c.Run(ctx, nil) }) // the coordinator's View is the one answered from
	}
	wg.Go(func() { ch.coord.Run(ctx, ch.h.setView) })
	go func() {
		wg.Wait()
		ch.fmu.Lock() // no segment is followed after this
		ch.follows, ch.stopped = nil, true
		ch.fmu.Unlock()
		ch.wg.Wait()
		ch.rdb.Close()
		close(done)
	}()
	return done
}

// viewCounts is the number of verdicts by state of the last View
// counted.
type viewCounts struct {
	last   health.View
	counts map[health.State]int
}

// report sets the targets gauge from the checks' verdicts, v. Between a
// View and the next one made from it by a few changes, only those are
// counted again: every instance gets a View for each change the fleet
// publishes, and at 10,000 nodes a pass over them all was its largest
// cost of a flip after the View's own making.
func (vc *viewCounts) report(zone string, v health.View) {
	keys, ok := v.Changed(vc.last)
	if !ok || vc.counts == nil {
		vc.counts = map[health.State]int{}
		for _, verdict := range v.All() {
			vc.counts[verdict.State]++
		}
	} else {
		seen := make(map[string]bool, len(keys))
		for _, k := range keys {
			if seen[k] {
				continue
			}
			seen[k] = true
			if x, had := vc.last.Get(k); had {
				vc.counts[x.State]--
			}
			if x, has := v.Get(k); has {
				vc.counts[x.State]++
			}
		}
	}
	vc.last = v
	for _, st := range []health.State{health.Up, health.Down, health.Unknown} {
		targetsGauge.WithLabelValues(zone, st.String()).Set(float64(vc.counts[st]))
	}
}

// fleetObserver turns what the coordinator does into metrics.
type fleetObserver struct{ zone string }

func (o fleetObserver) Mode(mode string) {
	for _, m := range []string{lock.ModeCoordinated, lock.ModeLocal} {
		v := 0.0
		if m == mode {
			v = 1
		}
		redisMode.WithLabelValues(o.zone, m).Set(v)
	}
}

func (o fleetObserver) Leases(held int) { redisLeases.WithLabelValues(o.zone).Set(float64(held)) }

func (o fleetObserver) Message(result string) { redisMessages.WithLabelValues(o.zone, result).Inc() }

func (o fleetObserver) Resync(err error) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	redisResyncs.WithLabelValues(o.zone, result).Inc()
}

func (o fleetObserver) Propagation(d time.Duration) {
	redisPropagation.WithLabelValues(o.zone).Observe(d.Seconds())
}

func (o fleetObserver) Extend(extended, lost int) {
	redisExtensions.WithLabelValues(o.zone, "extended").Add(float64(extended))
	redisExtensions.WithLabelValues(o.zone, "lost").Add(float64(lost))
}

func (o fleetObserver) Write(ok, published bool) {
	result := "fenced"
	switch {
	case published:
		result = "published"
	case ok:
		result = "stored"
	}
	redisWrites.WithLabelValues(o.zone, result).Inc()
}
