package pgcluster

import (
	"slices"
	"strconv"
	"strings"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Values of the topology option, and the default of min_local.
const (
	topologyOff    = "off"    // every client the same answer: as before topology
	topologyPrefer = "prefer" // nearest nodes first, every node answered
	topologyLocal  = "local"  // only the nearest nodes, min_local of them at least

	defaultMinLocal = 1
	maxMinLocal     = 1000
)

// Distances of a node from a client, and the SRV priority each answers
// with (RFC 2782: lower first).
const (
	distZone   = 0 // same region and zone as the client
	distRegion = 1 // same region
	distOther  = 2 // elsewhere, or the client's place is unknown
)

var srvPriority = [...]uint16{distZone: 0, distRegion: 10, distOther: 20}

// Labels of the answers_total metric's distance: the nearest node an
// answer names, or unmapped for a client no network places.
var distanceLabel = [...]string{distZone: "same_zone", distRegion: "same_region", distOther: "other"}

const distanceUnmapped = "unmapped"

// labelClient is the name below each zone whose TXT record says where this
// instance places the asker (topology not off).
const labelClient = "_client"

var (
	topologyAnswers = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "topology_answers_total",
		Help:      "Counter of address and SRV answers that depend on the client's place, by the distance of the nearest node answered: same_zone, same_region, other, or unmapped (no network places the client).",
	}, []string{"zone", "distance"})

	ecsQueries = promauto.NewCounterVec(prometheus.CounterOpts{
		Namespace: plugin.Namespace,
		Subsystem: "pgcluster",
		Name:      "ecs_queries_total",
		Help:      "Counter of queries carrying EDNS Client Subnet (topology not off), by result: answered, or formerr (a malformed option).",
	}, []string{"zone", "result"})
)

// topologyCounters are the zone's topology metrics, looked up once.
type topologyCounters struct {
	distance              [3]prometheus.Counter
	unmapped              prometheus.Counter
	ecsAnswered, ecsError prometheus.Counter
}

func newTopologyCounters(cfg *settings) *topologyCounters {
	z := cfg.zones[0]
	tc := &topologyCounters{
		unmapped:    topologyAnswers.WithLabelValues(z, distanceUnmapped),
		ecsAnswered: ecsQueries.WithLabelValues(z, "answered"),
		ecsError:    ecsQueries.WithLabelValues(z, "formerr"),
	}
	for d, l := range distanceLabel {
		tc.distance[d] = topologyAnswers.WithLabelValues(z, l)
	}
	return tc
}

// parseTopologyOption parses "topology off|prefer|local" and "min_local COUNT".
func parseTopologyOption(c *caddy.Controller, cfg *settings, opt string, args []string) error {
	if len(args) != 1 {
		return c.ArgErr()
	}
	switch opt {
	case "topology":
		switch args[0] {
		case topologyOff, topologyPrefer, topologyLocal:
			cfg.topology = args[0]
		default:
			return c.Errf("topology: %q is not off, prefer or local", args[0])
		}
	case "min_local":
		n, err := strconv.Atoi(args[0])
		if err != nil || n < 1 || n > maxMinLocal {
			return c.Errf("min_local: %q is not a count of nodes from 1 to %d", args[0], maxMinLocal)
		}
		cfg.minLocal = n
	}
	return nil
}

// topologyOn reports whether answers depend on the client's place.
func (s *settings) topologyOn() bool { return s.topology != "" && s.topology != topologyOff }

// placeGroup is the records of one set at one place, a range of its
// placed order.
type placeGroup struct {
	place
	start, end int
}

// placed is one kind of record of a set (A, AAAA or SRV) arranged by the
// place of their nodes: order lists the set's record indices grouped by
// region, then zone (each group in the set's own order), and groups says
// where each place's run is. The records themselves stay the set's, shared
// by every place: a client's answer is a few runs of order, found by a
// binary search over the set's own places, whatever the number of networks.
type placed struct {
	order  []int32
	groups []placeGroup
}

// entryTopology is how a set's records are placed; nil when no node of
// the set has a place (every client gets the same answer).
type entryTopology struct {
	a, aaaa, srv placed
}

// newPlaced arranges the records whose nodes are at places; nil when none
// has a place.
func newPlaced(places []place) placed {
	order := make([]int32, len(places))
	for i := range order {
		order[i] = int32(i)
	}
	slices.SortStableFunc(order, func(i, j int32) int {
		if c := strings.Compare(places[i].region, places[j].region); c != 0 {
			return c
		}
		return strings.Compare(places[i].zone, places[j].zone)
	})
	var groups []placeGroup
	for i, r := range order {
		if i == 0 || places[r] != groups[len(groups)-1].place {
			groups = append(groups, placeGroup{place: places[r], start: i})
		}
		groups[len(groups)-1].end = i + 1
	}
	return placed{order: order, groups: groups}
}

// anyPlace reports whether one of places is known.
func anyPlace(places ...[]place) bool {
	for _, ps := range places {
		for _, p := range ps {
			if p != (place{}) {
				return true
			}
		}
	}
	return false
}

// run is a range [from, to) of a placed order.
type run struct{ from, to int }

func (r run) len() int { return r.to - r.from }

// sequence is the order in which a client gets a set's records: up to
// three groups of one distance each, nearest first, each of up to two runs
// of the placed order, each group rotated. Without order (nil) it is the
// set's own order, rotated: the answer every client got before topology.
type sequence struct {
	order  []int32
	groups [3]seqGroup
	n      int // records in every group
	ng     int
}

type seqGroup struct {
	runs [2]run
	n    int
	rot  int
	dist int
}

// add appends a group of the runs, at dist, rotated by rot.
func (s *sequence) add(dist, rot int, runs ...run) {
	g := seqGroup{dist: dist}
	for i, r := range runs {
		g.runs[i] = r
		g.n += r.len()
	}
	if g.n == 0 {
		return
	}
	g.rot = rot % g.n
	s.groups[s.ng] = g
	s.ng++
	s.n += g.n
}

// at returns the record index of the i-th record of the sequence, and its
// distance.
func (s *sequence) at(i int) (int, int) {
	for gi := 0; gi < s.ng; gi++ {
		g := &s.groups[gi]
		if i >= g.n {
			i -= g.n
			continue
		}
		k := (g.rot + i) % g.n
		r := g.runs[0]
		if k >= r.len() {
			k -= r.len()
			r = g.runs[1]
		}
		if s.order == nil {
			return r.from + k, g.dist
		}
		return int(s.order[r.from+k]), g.dist
	}
	return 0, distOther // not reached: i < s.n
}

// plainSequence is the set of n records in its own order from start, at
// dist: every client's answer with topology off, an unmapped client's with
// it on.
func plainSequence(n, start, dist int) sequence {
	var s sequence
	s.add(dist, start, run{0, n})
	return s
}

// placedSequence is the order a client at pl gets the records of p in,
// with rot the query's rotation: by topology prefer, the client's zone,
// then the rest of its region, then the rest; by local, only the first of
// zone, region and every record that has at least minLocal records.
func placedSequence(p *placed, pl place, local bool, minLocal, rot int) sequence {
	n := len(p.order)
	zone, region := run{}, run{}
	if pl.region != "" || pl.zone != "" {
		// Groups are sorted by region then zone: a region's groups are one
		// run, and the zone's group one run inside it.
		lo, _ := slices.BinarySearchFunc(p.groups, pl.region, func(g placeGroup, r string) int { return strings.Compare(g.region, r) })
		hi := lo
		for hi < len(p.groups) && p.groups[hi].region == pl.region {
			hi++
		}
		if lo < hi {
			region = run{p.groups[lo].start, p.groups[hi-1].end}
			if pl.region == "" {
				region = run{} // an unknown region is no region
			}
			if pl.zone != "" {
				if z, ok := slices.BinarySearchFunc(p.groups[lo:hi], pl.zone, func(g placeGroup, z string) int { return strings.Compare(g.zone, z) }); ok {
					g := p.groups[lo+z]
					zone = run{g.start, g.end}
				}
			}
		}
	}
	if region.len() == 0 {
		region = zone
	}
	if zone.len() == 0 {
		zone = run{region.from, region.from}
	}
	s := sequence{order: p.order}
	if local {
		switch {
		case zone.len() >= minLocal:
			s.add(distZone, rot, zone)
			return s
		case region.len() >= minLocal:
			s.add(distZone, rot, zone)
			s.add(distRegion, rot, run{region.from, zone.from}, run{zone.to, region.to})
			return s
		}
	}
	s.add(distZone, rot, zone)
	s.add(distRegion, rot, run{region.from, zone.from}, run{zone.to, region.to})
	s.add(distOther, rot, run{0, region.from}, run{region.to, n})
	return s
}
