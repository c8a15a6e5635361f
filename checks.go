package pgcluster

import (
	"context"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// startChecks starts the active health checks of cfg, feeding pb: the
// publisher hands it the nodes to check after each build, the checker hands
// back its verdicts. It returns a channel closed when the checker has
// stopped, after ctx is done, with every probe's socket closed.
func startChecks(ctx context.Context, cfg *settings, pb *publisher) (<-chan struct{}, error) {
	zone := cfg.zones[0]
	c, err := health.New(cfg.healthConfig(func(check, cause string, d time.Duration) {
		probes.WithLabelValues(zone, check, cause).Inc()
		probeDuration.WithLabelValues(zone, check).Observe(d.Seconds())
	}))
	if err != nil {
		return nil, err
	}
	pb.targets = c.SetTargets
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, pb.setView)
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
