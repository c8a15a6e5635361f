package pgcluster

import (
	"fmt"
	"hash/fnv"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/health"
)

// clusterBuild is one cluster's share of a snapshot: its rows, as given, and
// what they make. A change to the cluster's rows or verdicts builds it again;
// any other change leaves it as it is.
type clusterBuild struct {
	name string
	rows []Node // as given; kept for a build when only the verdicts change
	// parts are the cluster's names in each zone, in the order of the
	// zones; nil when none of its rows can be served.
	parts []*part
	// longest is the longest prefix of a name under the cluster: see
	// cluster.longest.
	longest  int
	stat     clusterStat
	verdicts map[string]string // by node name: served or not, and why
	targets  []health.Target
	skipped  []skipped
	hash     uint64 // see clusterHash
	failOpen int    // sets answered all_down open, over every zone
	// held is the node primary. was asked to hold (the publisher's
	// primaryHold); stat.held says whether it does.
	held string
}

// served reports whether cb has names: a row of it can be served.
func (cb *clusterBuild) served() bool { return cb != nil && cb.parts != nil }

// buildInput is everything a snapshot is made from.
type buildInput struct {
	*settings
	nodes    []Node
	aliases  []Alias
	networks []Network
	// view is the checks' verdicts by "cluster/name"; a node missing from
	// it is not checked yet.
	view health.View
}

// buildCluster makes the names of one cluster from its rows (every row
// whose cluster is name in lower case), the checks' verdicts and the node
// primary. holds, if any (see primaryHold). It is a pure function of its
// input: no I/O, no clock, no randomness.
func buildCluster(set *settings, view health.View, held, name string, rows []Node) *clusterBuild {
	cb := &clusterBuild{name: name, rows: rows, held: held}
	in := buildInput{settings: set, view: view}
	c := cb.validate(in, set.zoneLen())
	if c == nil {
		return cb
	}
	cb.longest = c.longest()
	for _, z := range set.zones {
		b := &builder{cb: cb, in: in, apex: under(name, z), names: map[string]*entry{}}
		b.cluster(c)
		b.addEmptyNonTerminals()
		cb.parts = append(cb.parts, newPart(b.names))
	}
	cb.hash = clusterHash(c, cb.stat.held+"/"+cb.stat.handedTo)
	return cb
}

// under is the name of label just below zone.
func under(label, zone string) string {
	if zone == "." {
		return label + "."
	}
	return label + "." + zone
}

// builder writes a cluster's names in one zone.
type builder struct {
	cb    *clusterBuild
	in    buildInput
	apex  string // the cluster's name in this zone
	names map[string]*entry
	nodes map[*member]string // each member's name
}

// entry returns the entry of prefix under the cluster, made when new.
func (b *builder) entry(prefix string) *entry {
	e := b.names[prefix]
	if e == nil {
		e = &entry{owner: prefix + b.apex}
		b.names[prefix] = e
	}
	return e
}

func hdr(name string, t uint16, ttl uint32) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: ttl}
}

func (b *builder) cluster(c *cluster) {
	ttl := b.in.ttl
	// A drained node serves under its own name alone: every shared name
	// (the cluster's, its roles', and so its aliases' and SRV records)
	// leaves it out, fail-open included.
	serving := func(m *member) bool { return m.serving && !m.Drain.drained() }
	// down: a node the registry allows but whose check fails; all_down
	// open answers these when none of a set serves.
	// A stale primary (split_brain newest_timeline) is never answered.
	down := func(m *member) bool { return m.registryOK && !m.serving && !m.stale && !m.Drain.drained() }
	b.nodes = make(map[*member]string, len(c.members))
	for _, m := range c.members {
		e := b.entry(m.Name + ".")
		b.nodes[m] = e.owner
		if m.serving {
			e.add(m.addr)
		}
		e.txt = &dns.TXT{Hdr: hdr(e.owner, dns.TypeTXT, ttl), Txt: nodeTXT(m, len(b.cb.stat.primaries), b.in.settings)}
	}
	all, allOpen := pick(c, serving), pick(c, down)
	primaries := c.primaries
	if handed := b.handedTo(c, primaries); handed != nil {
		// The old primary is on its way out: the promoted one is the one.
		primaries = []*member{handed}
		b.cb.stat.handedTo = handed.Name
	}
	primaryOpen := pick(c, func(m *member) bool { return down(m) && lastRole(m) == rolePrimary })
	standbys := pick(c, func(m *member) bool { return serving(m) && m.Role == roleStandby && !m.lagging })
	standbyOpen := pick(c, func(m *member) bool { return down(m) && lastRole(m) == roleStandby })
	var primary []*member
	switch {
	case len(primaries) == 1 && primaries[0].Drain.drained():
		// A drained primary (pgclusterctl drain -force): primary. has
		// no address, and none by fail-open either, until it is undrained
		// or another is promoted.
		primaryOpen = nil
	case len(primaries) == 1:
		primary = primaries
	case len(primaries) > 1:
		// Split brain: no address, and no fail-open either.
		primaryOpen = nil
	}
	if len(primaryOpen) > 1 {
		primaryOpen = nil
	}
	preferStandby, preferOpen := standbys, standbyOpen
	if len(preferStandby) == 0 && len(primary) == 1 {
		preferStandby, preferOpen = primary, nil
	} else if len(preferStandby) == 0 && len(preferOpen) == 0 {
		preferOpen = primaryOpen
	}
	held := b.heldPrimary(c, primaries)
	if held != nil {
		primary, primaryOpen = []*member{held}, nil
		b.cb.stat.held = held.Name
	}

	b.set("", all, allOpen)
	b.set(labelPrimary+".", primary, primaryOpen)
	pe := b.entry(labelPrimary + ".")
	answered := primary
	if pe.failOpen {
		answered = primaryOpen
	}
	pe.txt = &dns.TXT{Hdr: hdr(pe.owner, dns.TypeTXT, ttl), Txt: primaryTXT(primaries, answered, held != nil, pe.failOpen)}
	b.set(labelStandby+".", standbys, standbyOpen)
	b.set(labelReplica+".", standbys, standbyOpen)
	b.set(labelPreferStandby+".", preferStandby, preferOpen)
	// sync.: only what the primary reports as synchronous, never a
	// fall-back to other standbys, nor fail-open: a reader there counts
	// on every acknowledged commit.
	syncs := pick(c, func(m *member) bool { return serving(m) && m.Role == roleStandby && !m.lagging && m.isSync() })
	b.set(labelSync+".", syncs, nil)
	se := b.entry(labelSync + ".")
	se.txt = &dns.TXT{Hdr: hdr(se.owner, dns.TypeTXT, ttl), Txt: syncTXT(c, syncs)}
	ce := b.entry("")
	ce.txt = &dns.TXT{Hdr: hdr(ce.owner, dns.TypeTXT, ttl), Txt: clusterTXT(b.cb.stat)}
}

// heldPrimary is the node primary. holds (see primaryHold): the one the
// publisher asked for, while no node serves as primary, and only while it
// is out by its check alone (the registry allows it; not stale) with
// primary as the last role read. Else nil.
func (b *builder) heldPrimary(c *cluster, primaries []*member) *member {
	if b.cb.held == "" || len(primaries) > 0 {
		return nil
	}
	for _, m := range c.members {
		if m.Name == b.cb.held && !m.serving && m.registryOK && !m.stale && !m.Drain.drained() &&
			strings.HasPrefix(m.reason, reasonCheckPrefix) && lastRole(m) == rolePrimary {
			return m
		}
	}
	return nil
}

// handedTo is the promoted primary that primary. answers for the hand-over
// (see primary_hold.go): the one the publisher asked for, while it is still
// the promoted one of several claimants. Else nil.
func (b *builder) handedTo(c *cluster, primaries []*member) *member {
	if b.cb.held == "" || len(primaries) < 2 || b.cb.stat.promoted != b.cb.held {
		return nil
	}
	for _, m := range primaries {
		if m.Name == b.cb.held {
			return m
		}
	}
	return nil
}

// set writes a set name (the cluster itself, prefix "", or a role under
// it) with the addresses of members and an SRV record for each.
func (b *builder) set(prefix string, members, open []*member) {
	e := b.entry(prefix)
	se := b.entry(labelSRV + "." + prefix)
	if len(members) == 0 && len(open) > 0 && b.in.allDown == allDownOpen {
		members = open
		e.failOpen, se.failOpen = true, true
		b.cb.failOpen++
	}
	// Exactly the room needed: a zone holds hundreds of thousands of sets.
	v4 := 0
	for _, m := range members {
		if m.addr.Is4() {
			v4++
		}
	}
	e.a, e.aaaa = make([][4]byte, 0, v4), make([][16]byte, 0, len(members)-v4)
	se.srv = make([]service, 0, len(members))
	for _, m := range members {
		e.add(m.addr)
		se.srv = append(se.srv, service{target: b.nodes[m], addr: m.addr, port: uint16(m.Port)})
	}
	// Two nodes at one address (two ports, or one host's address put in
	// by self) are one address record; each keeps its SRV record.
	e.a, e.aaaa = distinct(e.a), distinct(e.aaaa)
	if b.in.topologyOn() {
		e.topo = setTopology(members)
		se.topo = e.topo
	}
}

// setTopology places the records of a set of members: each SRV record at
// its node's place, each address at the place of the first member that has
// it (the one distinct keeps). Nil when no member has a place.
func setTopology(members []*member) *entryTopology {
	var a, aaaa []place
	srv := make([]place, len(members))
	seen := make(map[netip.Addr]bool, len(members))
	for i, m := range members {
		pl := place{m.Region, m.Zone}
		srv[i] = pl
		if seen[m.addr] {
			continue
		}
		seen[m.addr] = true
		if m.addr.Is4() {
			a = append(a, pl)
		} else {
			aaaa = append(aaaa, pl)
		}
	}
	if !anyPlace(srv) {
		return nil
	}
	return &entryTopology{a: newPlaced(a), aaaa: newPlaced(aaaa), srv: newPlaced(srv)}
}

// distinct returns addrs without the repeats of an address, the first of
// each kept in order, in addrs's own array.
func distinct[T comparable](addrs []T) []T {
	if len(addrs) < 2 {
		return addrs
	}
	out := addrs[:1]
	if len(addrs) <= 16 {
		// A few addresses, as most sets have: compared, no map made.
		for _, a := range addrs[1:] {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
		return out
	}
	seen := make(map[T]bool, len(addrs))
	seen[addrs[0]] = true
	for _, a := range addrs[1:] {
		if !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	return out
}

// pick returns the members of c for which keep holds, in order.
func pick(c *cluster, keep func(*member) bool) []*member {
	var out []*member
	for _, m := range c.members {
		if keep(m) {
			out = append(out, m)
		}
	}
	return out
}

// lastRole is the role a node had when last known: read by its check
// before it failed, else the registry's.
func lastRole(m *member) string {
	if m.check.Role != "" {
		return m.check.Role
	}
	return m.Role
}

// addEmptyNonTerminals makes every name between an owner and the cluster
// exist, so that it answers NODATA rather than NXDOMAIN.
func (b *builder) addEmptyNonTerminals() {
	for _, prefix := range slices.Collect(maps.Keys(b.names)) {
		for p := parentPrefix(prefix); p != ""; p = parentPrefix(p) {
			if _, ok := b.names[p]; !ok {
				b.names[p] = ent
			}
		}
	}
}

// parentPrefix is prefix without its first label: "b.c." of "a.b.c.".
func parentPrefix(prefix string) string {
	return prefix[strings.IndexByte(prefix, '.')+1:]
}

// clusterHash fingerprints what the cluster's records are made of: every
// served row with its verdict (the check's state and cause, whether a
// standby lags, whether it is synchronous; never a WAL position or a lag
// in bytes or time). With the
// instance's own settings fixed, equal hashes mean equal records. A
// snapshot's hash is the sum of its clusters' and its aliases', so that a
// change updates it in proportion to what it changed, and the serial
// changes only when the content does.
func clusterHash(c *cluster, held string) uint64 {
	h := fnv.New64a()
	for _, m := range c.members {
		fmt.Fprintf(h, "%s/%s %s %d %s %s %t %s %s %t %t %t\n", c.name, m.Name, m.Address, m.Port, m.Role, m.addr, m.serving, m.reason, m.check.State, m.lagging, m.check.Leaving, m.isSync())
		// A node's place, when it has one: without, the hash is the one
		// rows had before nodes had places.
		if m.Region != "" || m.Zone != "" || m.placeIgnored != "" {
			fmt.Fprintf(h, "place %s/%s %s\n", m.Region, m.Zone, m.placeIgnored)
		}
		// Its drain, when it has one: without, the hash is the one rows
		// had before drains.
		if d := m.Drain; d.drained() {
			fmt.Fprintf(h, "drain %d %q %q %d\n", d.ID, d.Reason, d.By, d.Until)
		}
	}
	fmt.Fprintf(h, "replicas %s\n", c.replicas)
	fmt.Fprintf(h, "held %s\n", held)
	return h.Sum64()
}
