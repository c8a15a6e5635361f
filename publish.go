package pgcluster

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/printable"
)

// publisher is the only writer of the snapshot. Its inputs are the
// registry's rows (applyAt) and, with checks on, the checks' verdicts
// (setView); each change of either makes the next snapshot out of the last
// one, building again only what the change touched, one change at a time,
// and swaps it in. It is made once, complete (newPublisher), before
// anything feeds it.
type publisher struct {
	set *settings
	// snap is the snapshot answered from: nil until the first is stored.
	snap atomic.Pointer[snapshot]
	// targets receives the nodes to check after each row update that
	// changed them, called with mu released (it may publish a View); nil
	// without checks. The nodes to check are made from the rows alone, so
	// a View or a hold never changes them.
	targets func([]health.Target)
	// tmu hands the targets over one set at a time, in the order built:
	// sent is the sequence number of the last set handed over.
	tmu  sync.Mutex
	sent uint64

	mu     sync.Mutex // one change at a time; guards what follows
	counts viewCounts // of the last View, for the targets gauge
	// waitView holds the first snapshot back until the first setView: with
	// a fleet, an instance answers only once it knows the fleet's verdicts.
	waitView bool
	rows     bool      // rows were loaded (or restored)
	cur      *snapshot // the last built, stored or held back: the next change's base
	loadedAt time.Time
	version  int64  // of the last rows (see rowsUpdate)
	built    uint64 // sequence number of the last targets built to hand over; 0: none yet
	// unreported holds the clusters built since the last snapshot stored,
	// and aliasesUnreported whether the aliases were resolved again: what
	// report looks at.
	unreported        map[string]bool
	aliasesUnreported bool
	// selfMissing holds the self options whose node the registry lacks,
	// so that each is warned about once, when it goes missing.
	selfMissing map[string]bool
	// holds are the primaries primary. holds (primary_hold.go).
	holds holds
	// quiet: a segment's publisher (segmentation), which reports nothing:
	// the home one logs and counts the zone's changes.
	quiet bool
	// after, when set, hears each rows update once applied (with mu
	// released): the segments' publishers apply it too.
	after func(rowsUpdate)
}

// places is the client networks' places of the last snapshot built
// (stored or held back until the first verdicts); nil before any.
func (pb *publisher) places() *placeMap {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	if pb.cur == nil {
		return nil
	}
	return pb.cur.places
}

// fork returns a quiet publisher that answers what pb answers, rows and
// all, until it is given verdicts of its own: a segment's (segmentation).
// It shows no snapshot before its first setView.
func (pb *publisher) fork() *publisher {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	return &publisher{set: pb.set, quiet: true, waitView: true,
		rows: pb.rows, cur: pb.cur, loadedAt: pb.loadedAt, version: pb.version}
}

// newPublisher makes the publisher of set's zone. targets is the checks'
// sink (nil without checks); waitView holds the first snapshot back until
// the first View (with a fleet's checks).
func newPublisher(set *settings, targets func([]health.Target), waitView bool) *publisher {
	return &publisher{set: set, targets: targets, waitView: waitView}
}

// applyAt makes the next snapshot with the rows u brings and publishes it,
// then hands the nodes to check to the checks when they changed.
func (pb *publisher) applyAt(u rowsUpdate) {
	pb.mu.Lock()
	pb.rows, pb.loadedAt, pb.version = true, u.loadedAt, u.version
	s := pb.change(change{rowsUpdate: u})
	var seq uint64
	if pb.targets != nil && (pb.built == 0 || s.targetsChanged) {
		pb.built++
		seq = pb.built
	}
	pb.mu.Unlock()
	if pb.after != nil {
		defer pb.after(u)
	}
	if seq == 0 {
		return
	}
	pb.tmu.Lock()
	defer pb.tmu.Unlock()
	if seq > pb.sent { // a later set may have been handed over first
		pb.sent = seq
		pb.targets(s.targets)
	}
}

// setView takes the checks' latest verdicts and, once rows are loaded,
// publishes the zone they make.
func (pb *publisher) setView(v health.View) {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	pb.waitView = false
	if !pb.quiet {
		pb.counts.report(pb.set.zones[0], v)
	}
	pb.change(change{view: v, viewSet: true})
}

// change makes the next snapshot with ch and, once rows are loaded (and the
// first verdicts are, when waitView), swaps it in; it returns the snapshot
// made. pb.mu is held.
func (pb *publisher) change(ch change) *snapshot {
	if pb.cur == nil {
		pb.cur = emptySnapshot(pb.set)
	}
	s := pb.cur.next(ch)
	if held, changed := pb.nextHeld(s, time.Now()); changed {
		h := s.next(change{held: held, heldSet: true})
		h.rebuilt = append(h.rebuilt, s.rebuilt...)
		h.aliasesChanged = h.aliasesChanged || s.aliasesChanged
		h.targetsChanged = h.targetsChanged || s.targetsChanged
		s = h
	}
	pb.cur = s
	if pb.unreported == nil {
		pb.unreported = map[string]bool{}
	}
	for _, c := range s.rebuilt {
		pb.unreported[c] = true
	}
	pb.aliasesUnreported = pb.aliasesUnreported || s.aliasesChanged
	if !pb.rows || pb.waitView {
		return s
	}
	s.loadedAt = pb.loadedAt
	prev := pb.snap.Load()
	serial := uint32(s.loadedAt.Unix())
	if prev != nil {
		switch {
		case prev.hash == s.hash:
			serial = prev.serial
		case !serialAfter(serial, prev.serial):
			serial = prev.serial + 1
		}
	}
	if pb.version > 0 {
		// Through the relay, the serial is the fleet's registry version,
		// as long as that does not take it backwards.
		serial = relaySerial(prev, pb.version, prev != nil && prev.hash == s.hash)
	}
	s.setSerial(serial, pb.set.ttl)
	pb.snap.Store(s)
	if pb.quiet {
		return s
	}
	loadTime.WithLabelValues(pb.set.zones[0]).Set(float64(s.loadedAt.UnixNano()) / 1e9)
	pb.report(prev, s)
	return s
}

// report updates metrics and logs what changed since prev, the snapshot
// stored before s: each change once. It looks at what was built since, not
// at the whole zone.
func (pb *publisher) report(prev, s *snapshot) {
	zone := pb.set.zones[0]
	first := prev == nil
	if first {
		prev = emptySnapshot(pb.set)
		log.Infof("Registry loaded: %d clusters, serial %d", s.servedClusters(), s.serial)
		// An instance before this one (a Corefile reload) may have left
		// series of clusters that are gone.
		nodesGauge.DeletePartialMatch(prometheus.Labels{"zone": zone})
		primariesGauge.DeletePartialMatch(prometheus.Labels{"zone": zone})
	}
	snapshotSerial.WithLabelValues(zone).Set(float64(s.serial))

	for _, name := range slices.Sorted(maps.Keys(pb.unreported)) {
		pb.reportCluster(zone, name, prev.clusters[name], s.clusters[name], first)
	}
	splitBrain.WithLabelValues(zone).Set(float64(s.split))
	primaryHeld.WithLabelValues(zone).Set(float64(s.heldN))
	if s.failOpen > 0 && prev.failOpen == 0 {
		log.Warningf("Every node of %d names fails its check: answering them anyway (all_down open)", s.failOpen)
	}
	if pb.aliasesUnreported {
		logSkipped(prev.aliases.skipped, s.aliases.skipped)
		reportMoves(zone, prev.aliases, s.aliases, first)
	}
	if prev.places != s.places {
		logSkipped(prev.places.skipped, s.places.skipped)
	}
	rowsSkipped.DeletePartialMatch(prometheus.Labels{"zone": zone})
	for reason, n := range s.skips {
		rowsSkipped.WithLabelValues(zone, reason).Set(float64(n))
	}
	clear(pb.unreported)
	pb.aliasesUnreported = false
	pb.checkSelf(s)
}

// reportCluster updates the metrics of a cluster built again, and logs what
// changed in it: was is the cluster as last reported, is as now (either
// nil when it has no rows).
func (pb *publisher) reportCluster(zone, name string, was, is *clusterBuild, first bool) {
	var wasStat, isStat clusterStat
	if was != nil {
		wasStat = was.stat
	}
	if is != nil {
		isStat = is.stat
	}
	switch {
	case is.served():
		nodesGauge.WithLabelValues(zone, name, "in").Set(float64(isStat.serving))
		nodesGauge.WithLabelValues(zone, name, "out").Set(float64(isStat.out))
		nodesGauge.WithLabelValues(zone, name, "drained").Set(float64(isStat.drained))
		primariesGauge.WithLabelValues(zone, name).Set(float64(len(isStat.primaries)))
	case was.served():
		nodesGauge.DeleteLabelValues(zone, name, "in")
		nodesGauge.DeleteLabelValues(zone, name, "out")
		nodesGauge.DeleteLabelValues(zone, name, "drained")
		primariesGauge.DeleteLabelValues(zone, name)
	}
	switch {
	case isStat.held != "" && wasStat.held == "":
		log.Infof("Cluster %q: primary %s left (%s) and no other node is primary yet: primary.%s holds its address for up to %s", name, isStat.held, is.verdicts[isStat.held], name, pb.set.holdFor())
	case wasStat.held != "" && isStat.held == "" && len(isStat.primaries) == 0:
		log.Warningf("Cluster %q: no node became primary while primary.%s held %s: primary.%s has no address", name, name, wasStat.held, name)
	}
	switch {
	case isStat.handedTo != "" && wasStat.handedTo == "":
		log.Infof("Cluster %q: %s was promoted while %v still claims to be primary: primary.%s answers %s for up to %s, and has no address if both still claim the role then",
			name, isStat.handedTo, slices.DeleteFunc(slices.Clone(isStat.primaries), func(n string) bool { return n == isStat.handedTo }), name, isStat.handedTo, pb.set.handoverFor())
	case isStat.split() && !wasStat.split():
		log.Warningf("Cluster %q: %d nodes claim to be primary %v: primary.%s has no address until one steps down", name, len(isStat.primaries), isStat.primaries, name)
	}
	reportPlaces(name, wasStat.placeServing, isStat.placeServing, pb.set.topology, first)
	var wasSkipped, isSkipped []skipped
	var wasVerdicts, isVerdicts map[string]string
	if was != nil {
		wasSkipped, wasVerdicts = was.skipped, was.verdicts
	}
	if is != nil {
		isSkipped, isVerdicts = is.skipped, is.verdicts
	}
	logSkipped(wasSkipped, isSkipped)
	for _, node := range slices.Sorted(maps.Keys(isVerdicts)) {
		v := isVerdicts[node]
		if old, ok := wasVerdicts[node]; ok && old != v {
			log.Infof("Node %s/%s: %s", name, node, v)
		} else if !ok && !first {
			log.Infof("Node %s/%s joined: %s", name, node, v)
		}
	}
	for _, node := range slices.Sorted(maps.Keys(wasVerdicts)) {
		if _, ok := isVerdicts[node]; !ok {
			log.Infof("Node %s/%s left the registry", name, node)
		}
	}
}

// reportPlaces logs, with topology on, each place of a cluster whose last
// serving node went (its clients' answers widen to the nearest nodes
// elsewhere) and each that serves again: was and is count the serving
// nodes by place, as last reported and now.
func reportPlaces(name string, was, is map[place]int, topology string, first bool) {
	for _, pl := range slices.SortedFunc(maps.Keys(is), comparePlaces) {
		n, known := was[pl]
		switch {
		case is[pl] == 0 && (known && n > 0 || !known && first):
			log.Warningf("Cluster %q: region %s zone %s has no serving node: its clients get the nearest nodes elsewhere (topology %s)", name, dash(pl.region), dash(pl.zone), topology)
		case is[pl] > 0 && known && n == 0:
			log.Infof("Cluster %q: region %s zone %s serves again (%d nodes): its clients get them first", name, dash(pl.region), dash(pl.zone), is[pl])
		}
	}
}

func comparePlaces(a, b place) int {
	if c := strings.Compare(a.region, b.region); c != 0 {
		return c
	}
	return strings.Compare(a.zone, b.zone)
}

// logSkipped warns of each row skipped in is that was not in was.
func logSkipped(was, is []skipped) {
	known := make(map[skipped]bool, len(was))
	for _, sk := range was {
		known[sk] = true
	}
	for _, sk := range is {
		switch {
		case known[sk]:
		case sk.reason == skipInvalidPlace && !strings.HasPrefix(sk.what, "network "):
			// The node itself is served, without its place.
			log.Warningf("Registry row's place ignored: %s", sk)
		default:
			log.Warningf("Registry row skipped, not served: %s", sk)
		}
	}
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
	for key := range pb.set.self {
		found := s.verdict(key) != ""
		if !strings.Contains(key, "/") {
			found = s.hasNode(key)
		}
		if !found && !pb.selfMissing[key] {
			log.Warningf("self %s: no such node in the registry; check the node name (NAME or CLUSTER/NAME)", key)
		}
		pb.selfMissing[key] = !found
	}
}

// reportMoves logs and counts each alias with fallbacks that points
// elsewhere in now than in was (on the first snapshot, each that points
// at a fallback): one line per move on every instance.
func reportMoves(zone string, was, now *aliasBuild, first bool) {
	before := map[string]string{}
	for _, a := range was.resolved {
		before[a.alias] = a.target
	}
	for _, a := range now.resolved {
		if !a.failover {
			continue
		}
		old, had := before[a.alias]
		if had && old == a.target || !had && !first || first && strings.EqualFold(a.target, a.row.Target) {
			continue
		}
		aliasMoves.WithLabelValues(zone, a.alias, a.target).Inc()
		if strings.EqualFold(a.target, a.row.Target) {
			log.Infof("Alias %q points at its own target %s again (failed back)", a.alias, a.target)
			continue
		}
		log.Infof("Alias %q points at %s: failed over from %s at %s: %s", a.alias, a.target, a.row.Target,
			time.UnixMicro(a.row.MovedAt).UTC().Format(time.RFC3339), printable.Cut(a.row.Why, maxTXTString))
	}
}
