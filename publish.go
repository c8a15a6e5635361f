package pgcluster

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgcluster/pgcluster/health"
)

// publisher is the only writer of the snapshot. Its inputs are the
// registry's rows (applyAt) and, with checks on, the checks' verdicts
// (setView); each change of either rebuilds the zone from the latest of
// both, one build at a time, and swaps it in.
type publisher struct {
	p   *PgCluster
	set *settings
	// targets receives the nodes to check after each build that changed
	// them; nil without checks.
	targets func([]health.Target)
	// waitView holds the first snapshot back until the first setView: with
	// a fleet, an instance answers only once it knows the fleet's verdicts.
	waitView bool

	mu       sync.Mutex // one build at a time; guards what follows
	rows     bool       // rows were loaded (or restored)
	nodes    []Node
	aliases  []Alias
	loadedAt time.Time
	view     health.View
	// selfMissing holds the self options whose node the registry lacks,
	// so that each is warned about once, when it goes missing.
	selfMissing map[string]bool
}

// apply builds a snapshot from rows loaded now and publishes it.
func (pb *publisher) apply(nodes []Node, aliases []Alias) { pb.applyAt(nodes, aliases, time.Now()) }

// applyAt builds a snapshot from rows loaded at loadedAt (earlier, when they
// are the last instance's, restored after a Corefile reload) and publishes it.
func (pb *publisher) applyAt(nodes []Node, aliases []Alias, loadedAt time.Time) {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	pb.rows, pb.nodes, pb.aliases, pb.loadedAt = true, nodes, aliases, loadedAt
	pb.publish()
}

// setView takes the checks' latest verdicts and, once rows are loaded,
// publishes the zone they make.
func (pb *publisher) setView(v health.View) {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	pb.view = v
	pb.waitView = false
	reportView(pb.set.zones[0], v)
	if pb.rows {
		pb.publish()
	}
}

// publish builds a snapshot of the current inputs and swaps it in. pb.mu is held.
func (pb *publisher) publish() {
	s := build(buildInput{settings: pb.set, nodes: pb.nodes, aliases: pb.aliases, view: pb.view})
	s.loadedAt = pb.loadedAt
	prev := pb.p.snap.Load()
	if pb.targets != nil && (prev == nil || !slices.Equal(prev.targets, s.targets)) {
		pb.targets(s.targets)
	}
	if pb.waitView {
		return
	}
	serial := uint32(s.loadedAt.Unix())
	if prev != nil {
		switch {
		case prev.hash == s.hash:
			serial = prev.serial
		case serial <= prev.serial:
			serial = prev.serial + 1
		}
	}
	s.setSerial(serial, pb.set.ttl)
	pb.p.snap.Store(s)
	loadTime.WithLabelValues(pb.set.zones[0]).Set(float64(s.loadedAt.UnixNano()) / 1e9)
	pb.report(prev, s)
}

// report updates metrics and logs what changed since prev: each change once.
func (pb *publisher) report(prev, s *snapshot) {
	if prev == nil {
		prev = &snapshot{}
		log.Infof("Registry loaded: %d clusters, serial %d", len(s.clusters), s.serial)
	}
	zone := pb.set.zones[0]
	snapshotSerial.WithLabelValues(zone).Set(float64(s.serial))

	nodesGauge.DeletePartialMatch(prometheus.Labels{"zone": zone})
	primariesGauge.DeletePartialMatch(prometheus.Labels{"zone": zone})
	split := 0
	for name, st := range s.clusters {
		if len(st.primaries) > 1 {
			split++
		}
		nodesGauge.WithLabelValues(zone, name, "in").Set(float64(st.serving))
		nodesGauge.WithLabelValues(zone, name, "out").Set(float64(st.out))
		primariesGauge.WithLabelValues(zone, name).Set(float64(len(st.primaries)))
		if len(st.primaries) > 1 && len(prev.clusters[name].primaries) <= 1 {
			log.Warningf("Cluster %q: %d nodes claim to be primary %v: primary.%s has no address until one steps down", name, len(st.primaries), st.primaries, name)
		}
	}
	splitBrain.WithLabelValues(zone).Set(float64(split))
	if s.failOpen > 0 && prev.failOpen == 0 {
		log.Warningf("Every node of %d names fails its check: answering them anyway (all_down open)", s.failOpen)
	}

	rowsSkipped.DeletePartialMatch(prometheus.Labels{"zone": zone})
	counts := map[string]int{}
	known := make(map[skipped]bool, len(prev.skipped))
	for _, sk := range prev.skipped {
		known[sk] = true
	}
	for _, sk := range s.skipped {
		counts[sk.reason]++
		if !known[sk] {
			log.Warningf("Registry row skipped, not served: %s", sk)
		}
	}
	for reason, n := range counts {
		rowsSkipped.WithLabelValues(zone, reason).Set(float64(n))
	}

	for key, v := range s.verdicts {
		if old, ok := prev.verdicts[key]; ok && old != v {
			log.Infof("Node %s: %s", key, v)
		} else if !ok && prev.verdicts != nil {
			log.Infof("Node %s joined: %s", key, v)
		}
	}
	for key := range prev.verdicts {
		if _, ok := s.verdicts[key]; !ok {
			log.Infof("Node %s left the registry", key)
		}
	}
	pb.checkSelf(s)
}

// checkSelf warns, once each time it happens, that a self option names a
// node the registry does not hold.
func (pb *publisher) checkSelf(s *snapshot) {
	if len(pb.set.self) == 0 {
		return
	}
	if pb.selfMissing == nil {
		pb.selfMissing = map[string]bool{}
	}
	names := map[string]bool{}
	for key := range s.verdicts {
		names[key[strings.IndexByte(key, '/')+1:]] = true
	}
	for key := range pb.set.self {
		_, found := s.verdicts[key]
		if !strings.Contains(key, "/") {
			found = names[key]
		}
		if !found && !pb.selfMissing[key] {
			log.Warningf("self %s: no such node in the registry; check the node name (NAME or CLUSTER/NAME)", key)
		}
		pb.selfMissing[key] = !found
	}
}
