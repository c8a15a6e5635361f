package pgcluster

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/rediserr"
	"github.com/pgcluster/pgcluster/lock"
)

// startChecks starts the active health checks of cfg, feeding pb: the
// publisher hands it the nodes to check after each build, the checker hands
// back its verdicts. With redis, a lock.Coordinator shares the checks with
// the fleet: it tells the checker which nodes to probe, and its View (this
// instance's verdicts and the holders') is the one pb answers from. It
// returns a channel closed when the checks have stopped, after ctx is done,
// with every probe's socket closed and, with redis, the leases released.
// The Views go through a handover (checks_handover.go): after a Corefile
// reload, the verdicts of the instance replaced stand in until this one's
// own have judged each node.
func startChecks(ctx context.Context, cfg *settings, pb *publisher) (<-chan struct{}, error) {
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
	if cfg.redisURL == "" {
		c, err := health.New(hc)
		if err != nil {
			return nil, err
		}
		h := startHandover(ctx, handoverKey(cfg), pb.setView, carryFor(cfg))
		pb.targets = func(ts []health.Target) {
			h.setTargets(ts)
			c.SetProbeBudget(cfg.probeBudgetFor(len(ts)))
			c.SetTargets(ts)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.Run(ctx, h.setView)
		}()
		return done, nil
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
		WAL:      cfg.maxLag > 0,
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
	// The token names this instance in Redis (leases, statuses,
	// pgclusterctl status): say which host it is.
	redisMember.DeletePartialMatch(prometheus.Labels{"zone": zone})
	redisMember.WithLabelValues(zone, coord.Token()).Set(1)
	log.Infof("Redis: this instance is fleet member %s (%s); its full token is %s", short(coord.Token()), cfg.instance, coord.Token())
	// Answer only once the fleet's statuses are read, or with the
	// verdicts of the instance this one replaces (a Corefile reload).
	pb.waitView = true
	h := startHandover(ctx, handoverKey(cfg), pb.setView, carryFor(cfg))
	pb.targets = func(ts []health.Target) {
		h.setTargets(ts)
		coord.SetTargets(ts)
		c.SetProbeBudget(cfg.probeBudgetFor(len(ts)))
		c.SetTargets(ts)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { c.Run(ctx, nil) }) // the coordinator's View is the one answered from
	wg.Go(func() { coord.Run(ctx, h.setView) })
	go func() {
		wg.Wait()
		rdb.Close()
		close(done)
	}()
	return done, nil
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
