package pgcluster

import (
	"sync"
	"time"

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
		Help:      "Nodes per cluster, by state: in (served) or out (not served).",
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

	snapshotSerial = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "snapshot_serial",
		Help:      "SOA serial of the snapshot being served.",
	}, []string{"zone"})
)

// snapshotAge reports, at scrape time, how long ago each live instance last
// loaded the registry.
var snapshotAge = &ageCollector{
	desc: prometheus.NewDesc(prometheus.BuildFQName(plugin.Namespace, "pgcluster", "snapshot_age_seconds"),
		"Seconds since the snapshot being served was loaded from the registry.", []string{"zone"}, nil),
	live: map[*PgCluster]string{},
}

func init() { prometheus.MustRegister(snapshotAge) }

type ageCollector struct {
	desc *prometheus.Desc
	mu   sync.Mutex
	live map[*PgCluster]string
}

func (a *ageCollector) add(p *PgCluster, zone string) {
	a.mu.Lock()
	a.live[p] = zone
	a.mu.Unlock()
}

func (a *ageCollector) remove(p *PgCluster) {
	a.mu.Lock()
	delete(a.live, p)
	a.mu.Unlock()
}

// Describe implements prometheus.Collector.
func (a *ageCollector) Describe(ch chan<- *prometheus.Desc) { ch <- a.desc }

// Collect implements prometheus.Collector.
func (a *ageCollector) Collect(ch chan<- prometheus.Metric) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for p, zone := range a.live {
		if s := p.snap.Load(); s != nil {
			ch <- prometheus.MustNewConstMetric(a.desc, prometheus.GaugeValue, time.Since(s.loadedAt).Seconds(), zone)
		}
	}
}
