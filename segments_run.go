package pgcluster

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/coredns/coredns/plugin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/pgcluster/pgcluster/health"
)

// segmentation, with check_scope zone or region, answers each client with
// the verdicts of its segment of the network: each segment's probing
// instances share theirs under the segment's own Redis prefix, and this
// instance follows every segment its clients come from (the places of
// pgcluster_networks) without probing for it, one passive coordinator
// each (checks.follow). Each segment has its own publisher, a fork of the
// home one (this instance's segment) fed the same rows and that segment's
// verdicts; a client whose segment has no snapshot yet, or that maps to
// no segment, is answered from the home one.
//
// A segment with no live prober of its own (no instance runs there, or
// Redis does not answer) is answered with the fleet's other verdicts: a
// node is up there when any segment that has probers finds it up (it is
// reachable from somewhere), else as the first of them judges it.
type segmentation struct {
	set    *settings
	home   *publisher
	follow func(seg string, apply func(health.View)) (probers func() (int, bool), stop func())

	mu   sync.Mutex // one change at a time; guards what follows
	segs map[string]*segment
	// homeView is the home segment's verdicts; homeLive whether they are
	// its own probers' (always, for a probing instance: in local mode its
	// own probes; for a passive one, while its segment has members).
	homeView    *health.View       // nil until the first
	homeMembers func() (int, bool) // nil: a probing instance (always its own)
	homeUsing   atomic.Value
	homeGiven   bool // the home publisher was given verdicts
	homeOwn     bool // ... and the last were its own probers'
	// byPlace is what ServeDNS reads: each segment's publisher by the
	// place key (segmentKey) of its clients.
	byPlace atomic.Pointer[map[place]*segment]
	full    bool // maxSegments reached: said once
}

// maxSegments bounds the segments an instance follows: each is a Redis
// subscription, a read of its members every half interval and a snapshot,
// and pgcluster_networks is anyone's with write access to the registry.
const maxSegments = 64

// segment is one segment this instance follows.
type segment struct {
	name    string
	pub     *publisher
	probers func() (int, bool)
	stop    func()       // stops following it
	view    *health.View // its own probers' verdicts, as last read; nil until the first
	// using says whose verdicts answer its clients: "own", or "fleet"
	// while it has no live prober; read by _client's TXT.
	using atomic.Value
}

// Whose verdicts answer a segment's clients.
const (
	usingOwn   = "own"
	usingFleet = "fleet"
	usingLast  = "last" // nobody's live: the last verdicts read
)

func newSegmentation(set *settings, home *publisher) *segmentation {
	sg := &segmentation{set: set, home: home, segs: map[string]*segment{}}
	sg.homeUsing.Store(usingOwn)
	empty := map[place]*segment{}
	sg.byPlace.Store(&empty)
	return sg
}

// rowsApplied follows the rows the home publisher applied: each segment's
// publisher applies them too, the segments of the networks' places not
// followed yet are followed from now on, and those no network places any
// more are not followed any longer.
func (sg *segmentation) rowsApplied(u rowsUpdate) {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(sg.segs)) {
		sg.segs[name].pub.applyAt(u)
	}
	places := sg.home.places()
	if places == nil || sg.follow == nil {
		return
	}
	changed := false
	byPlace := maps.Clone(*sg.byPlace.Load())
	home := sg.set.home()
	placed := map[place]bool{}
	for _, pl := range places.places {
		if key, ok := sg.set.segmentKey(pl); ok {
			placed[key] = true
		}
	}
	var dropped []string
	for key, seg := range byPlace {
		if !placed[key] {
			delete(byPlace, key)
			delete(sg.segs, seg.name)
			seg.stop()
			segmentVerdicts.DeleteLabelValues(sg.set.zones[0], seg.name)
			dropped = append(dropped, seg.name)
			changed = true
		}
	}
	if len(dropped) > 0 {
		slices.Sort(dropped)
		log.Infof("Health checks: no network places clients in %v any more: not following their verdicts", dropped)
	}
	for _, pl := range places.places {
		key, ok := sg.set.segmentKey(pl)
		if !ok {
			continue
		}
		name := segmentName(key)
		if name == home {
			continue
		}
		if _, known := byPlace[key]; known {
			continue
		}
		seg := sg.segs[name]
		if seg == nil && len(sg.segs) >= maxSegments {
			if !sg.full {
				sg.full = true
				log.Warningf("Health checks: pgcluster_networks names more than %d other %ss: the clients of %s and beyond are answered with this instance's %s's verdicts", maxSegments, sg.set.checkScope, name, sg.set.checkScope)
			}
			continue
		}
		if seg == nil {
			seg = &segment{name: name, pub: sg.home.fork()}
			seg.using.Store(usingLast)
			sg.segs[name] = seg
			seg.probers, seg.stop = sg.follow(name, func(v health.View) { sg.setSegment(seg, v) })
		}
		byPlace[key] = seg
		changed = true
	}
	if changed {
		sg.byPlace.Store(&byPlace)
		log.Infof("Health checks: following the verdicts of %d other %ss for their clients: %v", len(sg.segs), sg.set.checkScope, slices.Sorted(maps.Keys(sg.segs)))
	}
}

// setHome takes the home segment's verdicts.
func (sg *segmentation) setHome(v health.View) {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	sg.homeView = &v
	sg.mix()
}

// setSegment takes a followed segment's verdicts (or a change of its
// members: its coordinator makes a View again then).
func (sg *segmentation) setSegment(seg *segment, v health.View) {
	sg.mu.Lock()
	defer sg.mu.Unlock()
	seg.view = &v
	sg.mix()
}

// mix gives each segment's publisher the verdicts its clients are
// answered with: its own probers' while it has live ones; the fleet's
// other verdicts while Redis says it has none; the last it was given
// while Redis cannot be read (its probers may well be there: another
// segment's verdicts would answer for nodes it may not reach). sg.mu is
// held.
func (sg *segmentation) mix() {
	judge := func(view *health.View, probers func() (int, bool)) string {
		if view == nil || probers == nil {
			return usingLast
		}
		switch n, readable := probers(); {
		case n > 0 && readable:
			return usingOwn
		case readable:
			return usingFleet
		}
		return usingLast
	}
	homeUsing := usingOwn // a probing instance: its own probes, in local mode too
	if sg.homeMembers != nil {
		homeUsing = judge(sg.homeView, sg.homeMembers)
	}
	var live []health.View
	if homeUsing == usingOwn && sg.homeView != nil {
		live = append(live, *sg.homeView)
	}
	names := slices.Sorted(maps.Keys(sg.segs))
	using := map[string]string{}
	for _, name := range names {
		seg := sg.segs[name]
		using[name] = judge(seg.view, seg.probers)
		// A segment whose probers cannot be read counts by the last
		// verdicts read of them: segments that stop being read one
		// after the other must not leave the fleet's verdicts to the
		// last one read.
		if using[name] != usingFleet && seg.view != nil {
			live = append(live, *seg.view)
		}
	}
	var fleet *health.View
	if len(live) > 0 {
		m := mergeViews(live)
		fleet = &m
	}
	// The home segment: a probing instance's own verdicts always (in
	// local mode, its own probes); a passive one's as any other segment.
	switch {
	case sg.homeView == nil:
	case homeUsing == usingOwn:
		sg.homeUsing.Store(usingOwn)
		sg.home.setView(*sg.homeView)
		sg.homeGiven, sg.homeOwn = true, true
	case fleet != nil && (homeUsing == usingFleet || !sg.homeOwn):
		// No prober here, or none read last: the fleet's verdicts (for
		// segments that cannot be read, the last ones read of them).
		sg.homeUsing.Store(homeUsing)
		sg.home.setView(*fleet)
		sg.homeGiven, sg.homeOwn = true, false
	case !sg.homeGiven:
		sg.homeUsing.Store(homeUsing)
		sg.home.setView(*sg.homeView)
		sg.homeGiven = true
	default:
		// The home segment's own probers cannot be read: the last
		// verdicts read of them stand.
		sg.homeUsing.Store(usingLast)
	}
	changed := map[string][]string{} // segments by what answers them now
	for _, name := range names {
		seg := sg.segs[name]
		was := seg.using.Load()
		switch {
		case using[name] == usingOwn:
			seg.using.Store(usingOwn)
			seg.pub.setView(*seg.view)
		case using[name] == usingFleet && fleet != nil:
			seg.using.Store(usingFleet)
			seg.pub.setView(*fleet)
		default:
			// Its own last verdicts read stand: the publisher keeps the
			// last View it was given.
			seg.using.Store(usingLast)
		}
		if now := seg.using.Load().(string); now != was {
			segmentVerdicts.WithLabelValues(sg.set.zones[0], name).Set(usingValue(now))
			changed[now] = append(changed[now], name)
		}
	}
	// One line per change, whatever the number of segments.
	if s := changed[usingFleet]; len(s) > 0 {
		log.Warningf("Health checks: %v: no live prober there: their clients are answered with the fleet's other verdicts", s)
	}
	if s := changed[usingLast]; len(s) > 0 {
		log.Warningf("Health checks: %v: their probers' verdicts cannot be read (Redis does not answer): their clients are answered with the last ones read", s)
	}
	if s := changed[usingOwn]; len(s) > 0 {
		log.Infof("Health checks: %v: their clients are answered with their own probers' verdicts", s)
	}
}

// usingValue is the segment_verdicts gauge's value of using.
func usingValue(using string) float64 {
	switch using {
	case usingOwn:
		return 0
	case usingFleet:
		return 1
	}
	return 2
}

// mergeViews is the fleet's verdict on each node from the views of the
// segments that have probers: up where any finds it up, else the first
// view's that judges it.
func mergeViews(views []health.View) health.View {
	if len(views) == 1 {
		return views[0]
	}
	out := map[string]health.Verdict{}
	for _, v := range views {
		for k, verdict := range v.All() {
			have, ok := out[k]
			if !ok || have.State != health.Up && verdict.State == health.Up {
				out[k] = verdict
			}
		}
	}
	return health.ViewOf(out)
}

// forPlace is the snapshot that answers a client at pl, the segment's
// name and whose verdicts it holds; the home snapshot (name "") when pl
// has no segment followed, or its own snapshot is not made yet.
func (sg *segmentation) forPlace(pl place) (*snapshot, *segment) {
	key, ok := sg.set.segmentKey(pl)
	if !ok {
		return nil, nil
	}
	seg := (*sg.byPlace.Load())[key]
	if seg == nil {
		return nil, nil
	}
	s := seg.pub.snap.Load()
	if s == nil {
		return nil, nil
	}
	return s, seg
}

var (
	segmentVerdicts = promauto.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "segment_verdicts",
		Help:      "With check_scope zone or region, whose verdicts answer each segment's clients: 0 its own probers', 1 the fleet's other verdicts (it has no live prober), 2 the last read (no segment's probers can be read).",
	}, []string{"zone", "segment"})

	segmentProbes = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "segment_probes_total",
		Help:      "With check_scope zone or region, counter of the probes this instance sent for its segment.",
	}, []string{"zone", "segment"})
)

// clientChecks is what _client's TXT adds with check_scope zone or region:
// the segment whose snapshot answers the asker (seg; nil: this
// instance's own) and whose verdicts it holds.
func (sg *segmentation) clientChecks(seg *segment) []string {
	name, using := sg.set.home(), sg.homeUsing.Load()
	if seg != nil {
		name, using = seg.name, seg.using.Load()
	}
	return []string{"checks=" + strings.ReplaceAll(name, " ", ":"), "verdicts=" + using.(string)}
}
