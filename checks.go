package pgcluster

import (
	"context"
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
	c   *health.Checker
	// coord and rdb are the fleet's, with redis; nil without.
	coord *lock.Coordinator
	rdb   redis.UniversalClient
}

// newChecks makes the health checks of cfg.
func newChecks(cfg *settings) (*checks, error) {
	zone := cfg.zones[0]
	hc := cfg.healthConfig(func(check, cause string, d time.Duration) {
		probes.WithLabelValues(zone, check, cause).Inc()
		probeDuration.WithLabelValues(zone, check).Observe(d.Seconds())
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
	coord, err := lock.NewCoordinator(rdb, lock.Config{
		Prefix:   cfg.redisPrefix,
		Interval: cfg.interval,
		Timeout:  cfg.timeout,
		Secret:   cfg.redisSecret,
		Token:    cfg.token,
		Name:     cfg.instance,
		WAL:      cfg.judgesLag(),
		Logf:     redisLogf(rediserr.Watch(rdb)),
		Observer: fleetObserver{zone},
	})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	hc.Shared = coord
	c, err := health.New(hc)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	coord.SetProbeNow(c.ProbeNow)
	ch.c, ch.coord, ch.rdb = c, coord, rdb
	return ch, nil
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
	log.Infof("Redis: this instance is fleet member %s (%s); its full token is %s", short(ch.coord.Token()), ch.cfg.instance, ch.coord.Token())
	ch.h.start(ctx, publish, carryFor(ch.cfg))
	var wg sync.WaitGroup
	wg.Go(func() { ch.c.Run(ctx, nil) }) // the coordinator's View is the one answered from
	wg.Go(func() { ch.coord.Run(ctx, ch.h.setView) })
	go func() {
		wg.Wait()
		ch.rdb.Close()
		close(done)
	}()
	return done
}

// reportView sets the targets gauge from the checks' verdicts.
func reportView(zone string, v health.View) {
	counts := map[health.State]int{}
	for _, verdict := range v {
		counts[verdict.State]++
	}
	for _, st := range []health.State{health.Up, health.Down, health.Unknown} {
		targetsGauge.WithLabelValues(zone, st.String()).Set(float64(counts[st]))
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
