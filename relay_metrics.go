package pgcluster

import (
	"github.com/coredns/coredns/plugin"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// The registry relay (relay.go): one follower of PostgreSQL per fleet, the
// other instances fed through Redis.
var (
	relayRole = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "relay_role",
		Help:      "1 for this instance's role in the registry relay: follower (follows PostgreSQL for the fleet), reader (reads the registry from Redis) or local (follows PostgreSQL itself: Redis does not answer).",
	}, []string{"zone", "role"})

	registryVersion = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "registry_version",
		Help:      "The fleet's registry version served (the SOA serial); 0 while the rows served were read here in local mode.",
	}, []string{"zone"})

	relayLag = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "relay_lag_seconds",
		Help:      "Histogram of the time from the follower's read of a change (just after its COMMIT) to its application here (clocks of both instances).",
		Buckets:   prometheus.ExponentialBuckets(0.0001, 2, 17),
	}, []string{"zone"})

	relayReads = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "relay_reads_total",
		Help:      "Counter of reads of the registry copy that brought something, by result: delta (the fields changed), full (the whole copy), stale (older than the one applied, or, with none applied yet, not vouched for by the follower within a lease), rejected (not what a follower wrote: unsigned, wrongly signed, changed since, larger than any, or ahead of Redis's clock; and messages on the copy's channel that are no version), foreign (a copy of another registry: another fleet shares the prefix).",
	}, []string{"zone", "result"})

	relayWrites = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "relay_writes_total",
		Help:      "Counter of this instance's writes of the registry copy as follower, by result: delta, full, fenced (refused: the lease is another instance's).",
	}, []string{"zone", "result"})
)
