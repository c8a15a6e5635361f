package pgcluster

import (
	"github.com/coredns/coredns/plugin"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Variables declared for monitoring. Every one carries the zone label: the
// first zone of the pgcluster block it belongs to.
var (
	reloads = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "registry_reloads_total",
		Help:      "Counter of registry loads, by result (ok or error).",
	}, []string{"zone", "result"})

	reloadDuration = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "registry_reload_duration_seconds",
		Help:      "Histogram of the time a successful registry load took, from query to published snapshot.",
		Buckets:   prometheus.ExponentialBuckets(0.0005, 2, 14),
	}, []string{"zone"})

	registryUp = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "registry_up",
		Help:      "1 while the registry connection is up and listening, 0 while answers come from the last snapshot.",
	}, []string{"zone"})

	nodesGauge = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "nodes",
		Help:      "Nodes per cluster, by state: in (served), out (not served) or drained (serving, but drained out of every shared name).",
	}, []string{"zone", "cluster", "state"})

	primariesGauge = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "primaries",
		Help:      "Serving nodes per cluster that claim to be primary; primary.<cluster> has an address only when this is 1.",
	}, []string{"zone", "cluster"})

	rowsSkipped = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "rows_skipped",
		Help:      "Registry rows in the current snapshot that cannot be served, by reason.",
	}, []string{"zone", "reason"})

	probes = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "probes_total",
		Help:      "Counter of health-check probes, by check type and result (ok, or the cause of the failure).",
	}, []string{"zone", "check", "result"})

	probeDuration = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "probe_duration_seconds",
		Help:      "Histogram of the time a health-check probe took, by check type.",
		Buckets:   prometheus.ExponentialBuckets(0.0001, 2, 16),
	}, []string{"zone", "check"})

	checkSessions = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "check_sessions",
		Help:      "Sessions the postgres check keeps open to read the nodes' roles every role_interval: one per node this instance probes for the fleet.",
	}, []string{"zone"})

	probesDelayed = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "probes_delayed_total",
		Help:      "Counter of health-check probes that waited for probe_budget before they started.",
	}, []string{"zone"})

	primaryHeld = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "primary_held",
		Help:      "Clusters whose primary. still answers a primary that left by its check, while no other node is primary (primary_hold).",
	}, []string{"zone"})

	targetsGauge = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "check_targets",
		Help:      "Nodes under active health checks, by state: up, down or unknown (not decided yet).",
	}, []string{"zone", "state"})

	failoverWrites = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "alias_failover_writes_total",
		Help:      "Writes of an alias's fail-over or fail-back to the registry by this instance, by result: moved, unchanged (another instance's write came first) or error (the alias does not move).",
	}, []string{"zone", "result"})

	aliasMoves = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "alias_moves_total",
		Help:      "Changes of where an alias with fallbacks points, as this instance answers it, by alias and the target it points at after the change.",
	}, []string{"zone", "alias", "target"})

	splitBrain = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "split_brain_clusters",
		Help:      "Clusters in which two or more serving nodes claim to be primary: primary.<cluster> has no address.",
	}, []string{"zone"})

	failOpenAnswers = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "fail_open_answers_total",
		Help:      "Counter of answers that name nodes failing their check, because every node of the name does (all_down open).",
	}, []string{"zone"})

	snapshotSerial = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "snapshot_serial",
		Help:      "SOA serial of the snapshot being served.",
	}, []string{"zone"})

	loadTime = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "registry_load_timestamp_seconds",
		Help:      "The timestamp of the last successful load of the registry.",
	}, []string{"zone"})
)

// The fleet's coordination through Redis (redis option).
var (
	redisMode = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "redis_mode",
		Help:      "1 for the mode this instance is in: coordinated (Redis answers, one prober per node) or local (Redis does not answer, every node probed here).",
	}, []string{"zone", "mode"})

	redisMember = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "redis_member_info",
		Help:      "1, labelled with this instance's member token in Redis: what pgclusterctl status and the stored statuses name an instance by.",
	}, []string{"zone", "member"})

	redisLeases = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "redis_leases",
		Help:      "Leases this instance holds: the nodes it probes for the fleet.",
	}, []string{"zone"})

	redisMessages = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "redis_messages_total",
		Help:      "Counter of statuses read from Redis, by result: applied, stale (an older version than one applied), rejected (unreadable, unsigned or wrongly signed).",
	}, []string{"zone", "result"})

	redisWrites = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "redis_writes_total",
		Help:      "Counter of this instance's status writes, by result: published (changed, sent to the fleet), stored (unchanged, rewritten every five intervals), fenced (refused: the lease is another instance's).",
	}, []string{"zone", "result"})

	redisExtensions = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "redis_lease_extensions_total",
		Help:      "Counter of this instance's leases extended between status writes (their nodes' verdicts unchanged), by result: extended, lost (Redis no longer had the lease).",
	}, []string{"zone", "result"})

	redisResyncs = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "redis_resyncs_total",
		Help:      "Counter of reads of every stored status, by result (ok or error).",
	}, []string{"zone", "result"})

	redisPropagation = promauto.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "redis_propagation_seconds",
		Help:      "Histogram of the time from a holder's status write to its application here (clocks of both instances).",
		Buckets:   prometheus.ExponentialBuckets(0.0001, 2, 16),
	}, []string{"zone"})
)
