package pgcluster

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/health"
)

// entry is one owner name of the zone with every record it has. Addresses
// and SRV records are kept as their data alone, and made into records for
// each answer (the answer's records are the writers' to change, never the
// snapshot's): a node is in up to five sets, and a zone of 50,000 nodes
// would otherwise hold a million records.
type entry struct {
	owner string // the name, as its records spell it
	a     [][4]byte
	aaaa  [][16]byte
	srv   []service
	txt   *dns.TXT // the only TXT record a name has, or nil
	// apex holds a zone apex's own records.
	apex *apexRecords
	// failOpen: the addresses and SRV records are of nodes that fail their
	// check, answered because all of the set's nodes do (all_down open).
	failOpen bool
	// topo places the addresses and SRV records (see entryTopology); nil
	// with topology off and for sets whose nodes have no place.
	topo *entryTopology
	// ent marks an empty non-terminal: a name that exists only because
	// names under it do. Under an alias, such a name has no CNAME.
	ent bool
	// shared holds the entry's address records, made on the first answer
	// that may share them (see readOnlyWriter) and reused by every later one.
	shared atomic.Pointer[sharedRecords]
}

// sharedRecords are an entry's A and AAAA records with one TTL, each set
// twice over, so that the records of any rotation are one window of it.
// Nothing writes to them once made: many answers hold them at once.
type sharedRecords struct {
	ttl  uint32
	a    []dns.RR
	aaaa []dns.RR
}

// records returns e's shared records with ttl, made if e has none yet (or
// has them with another TTL). Two answers that make them at once each
// store equal records; either may stay.
func (e *entry) records(ttl uint32) *sharedRecords {
	if r := e.shared.Load(); r != nil && r.ttl == ttl {
		return r
	}
	r := &sharedRecords{
		ttl: ttl,
		a: twice(len(e.a), func(i int) dns.A {
			return dns.A{Hdr: hdr(e.owner, dns.TypeA, ttl), A: e.a[i][:]}
		}),
		aaaa: twice(len(e.aaaa), func(i int) dns.AAAA {
			return dns.AAAA{Hdr: hdr(e.owner, dns.TypeAAAA, ttl), AAAA: e.aaaa[i][:]}
		}),
	}
	e.shared.Store(r)
	return r
}

// apexRecords are the records only a zone's apex has: the NS set, the same
// on every instance given the same ns options, and the SOA, whose MNAME is
// the first of them. glue holds the addresses of the name servers inside
// the zone, A records first, for the additional section of an NS answer.
type apexRecords struct {
	ns   []dns.RR
	glue []dns.RR
	soa  *dns.SOA
}

// ent is the entry of every empty non-terminal: it has nothing, so all share it.
var ent = &entry{ent: true}

// service is an SRV record of a set, and its glue: the node's name, port
// and address.
type service struct {
	target string
	addr   netip.Addr
	port   uint16
}

// add adds the address a to e: an A record's, or an AAAA record's.
func (e *entry) add(a netip.Addr) {
	if a.Is4() {
		e.a = append(e.a, a.As4())
	} else {
		e.aaaa = append(e.aaaa, a.As16())
	}
}

// twice returns the n records made by rec, in one array, as a set twice
// over: record i at i and at n+i. Nil when n is 0.
func twice[T any, PT interface {
	*T
	dns.RR
}](n int, rec func(i int) T) []dns.RR {
	if n == 0 {
		return nil
	}
	recs := make([]T, n)
	set := make([]dns.RR, 2*n)
	for i := range recs {
		recs[i] = rec(i)
		set[i], set[n+i] = PT(&recs[i]), PT(&recs[i])
	}
	return set
}

// part holds the names at and under one name just below a zone: a
// cluster's, an alias's, the zone's apex or its ns name. A change replaces
// the parts it touches and shares the others with the snapshot before.
type part struct {
	// names are by their prefix before the part's own name: "" for the
	// name itself, "primary.", "_postgresql._tcp.primary.", ...
	names map[string]*entry
	// self is names[""], the entry of the part's own name (a cluster's
	// name, most asked of all): kept beside the map so that its answer
	// costs one map lookup, not two.
	self *entry
	// alias is set for an alias's part, which holds no names: a name under
	// the alias exists as a CNAME when the same prefix does under its final
	// cluster, and is made at query time.
	alias *aliasPart
}

// newPart returns the part of names, which are complete: a part's names
// never change once it is made.
func newPart(names map[string]*entry) *part {
	return &part{names: names, self: names[""]}
}

// entry returns the entry of the name with prefix before the part's own
// name, or nil.
func (p *part) entry(prefix string) *entry {
	if prefix == "" {
		return p.self
	}
	return p.names[prefix]
}

// aliasPart is where an alias's names point, as names just below the zone.
type aliasPart struct {
	target string // the alias's target: a cluster, or another alias
	final  string // the cluster at the end of the chain
	// state is _failover.<alias>: TXT of where an alias that may fail
	// over points now, and why; nil for an alias without fallbacks.
	state *entry
}

// labelFailover is the name under an alias whose TXT says where the
// alias points and why (see failoverTXT): a name no cluster can have
// under it (node names are DNS labels).
const labelFailover = "_failover"

// clusterStat is what metrics and logs report of one cluster.
type clusterStat struct {
	// serving and out count the nodes in and out of the shared names;
	// drained, those a drain keeps out that would otherwise serve.
	serving, out, drained int
	primaries             []string
	held                  string // the node primary. holds, if any
	// placeServing counts, with topology on, the serving nodes of each
	// known place: a place that has none left widens its clients' answers.
	placeServing map[place]int
	// promoted is, while several nodes claim to be primary, the one a
	// promotion made (see cluster.promoted); handedTo says that primary.
	// answers it for the hand-over (see primary_hold.go).
	promoted, handedTo string
}

// split reports a split brain: several nodes claim to be primary, and
// primary. has no address (no hand-over).
func (st clusterStat) split() bool { return len(st.primaries) > 1 && st.handedTo == "" }

// snapshot is an immutable view of every name pgcluster answers. The query
// path reads it without locks; a change publishes a new one (next) that
// shares with it everything the change did not touch.
type snapshot struct {
	set *settings
	// parts are by the name just below a zone they hold (see find), in every zone.
	parts map[string]*part
	// clusters are by served name (the registry's, in lower case), every
	// one the registry has rows of, served or not.
	clusters map[string]*clusterBuild
	aliases  *aliasBuild
	// places maps client addresses to places (pgcluster_networks).
	places *placeMap
	view   health.View
	// held is, by cluster, the node primary. holds (see primaryHold).
	held map[string]string

	serial   uint32
	hash     uint64
	loadedAt time.Time
	// targets are the nodes to check, when checks are on.
	targets []health.Target
	// failOpen counts the sets answered with nodes that fail their check,
	// because every node of the set does (all_down open); split the clusters
	// with more than one serving primary; skips the rows not served, by reason.
	failOpen int
	split    int
	heldN    int // clusters whose primary. holds a primary that left
	skips    map[string]int

	// What next changed to make this snapshot out of the one before: the
	// clusters rebuilt (or gone), and whether the aliases were resolved again.
	rebuilt        []string
	aliasesChanged bool
	targetsChanged bool
}

// emptySnapshot is the snapshot before the registry's first rows: every
// zone's apex and the names of its name servers inside it (see
// apexEntries), nothing else.
func emptySnapshot(set *settings) *snapshot {
	s := &snapshot{
		set:      set,
		parts:    map[string]*part{},
		clusters: map[string]*clusterBuild{},
		aliases:  resolveAliases(nil, nil, set),
		places:   newPlaceMap(nil),
		skips:    map[string]int{},
	}
	for _, z := range set.zones {
		maps.Copy(s.parts, apexEntries(set, z))
	}
	return s
}

// change is what moved since a snapshot was built: some clusters' rows
// and the aliases (its rowsUpdate: none when nodes is nil and aliasesSet
// false), the checks' verdicts, the primaries primary. holds.
type change struct {
	rowsUpdate
	// view is the checks' verdicts, when viewSet.
	view    health.View
	viewSet bool
	// held is, by cluster, the node primary. holds, when heldSet.
	held    map[string]string
	heldSet bool
}

// build makes a snapshot of in from nothing: what a full reload would serve.
func build(in buildInput) *snapshot {
	return emptySnapshot(in.settings).next(change{
		rowsUpdate: rowsUpdate{nodes: groupNodes(in.nodes), full: true, aliases: in.aliases, aliasesSet: true,
			networks: in.networks, networksSet: true},
		view: in.view, viewSet: true,
	})
}

// next returns the snapshot that s becomes with ch: the clusters whose rows
// or verdicts changed are built again, the aliases are resolved again when
// they or the clusters they may point to changed, and every other part is
// shared with s. The serial is set by the caller. It is a pure function of
// s and ch: no I/O, no clock, no randomness.
func (s *snapshot) next(ch change) *snapshot {
	n := &snapshot{
		set: s.set, parts: maps.Clone(s.parts), clusters: maps.Clone(s.clusters),
		aliases: s.aliases, places: s.places, view: s.view, held: s.held, hash: s.hash, targets: s.targets,
		failOpen: s.failOpen, split: s.split, heldN: s.heldN, skips: maps.Clone(s.skips),
	}
	if ch.viewSet {
		n.view = ch.view
	}
	if ch.networksSet {
		n.places = newPlaceMap(ch.networks)
		n.hash += n.places.hash - s.places.hash
		for _, sk := range s.places.skipped {
			n.skips[sk.reason]--
		}
		for _, sk := range n.places.skipped {
			n.skips[sk.reason]++
		}
	}

	// What to build again, and with which rows.
	dirty := map[string][]Node{}
	rowsChanged(&ch.rowsUpdate, s.clusters, func(cb *clusterBuild) []Node { return cb.rows }, s.set.staleAfter,
		func(name string) { dirty[name] = ch.nodes[name] })
	if ch.viewSet && s.set.checksOn() {
		for name := range changedClusters(s.view, ch.view, s.set.judgesLag()) {
			if _, ok := dirty[name]; !ok && s.clusters[name] != nil {
				dirty[name] = s.clusters[name].rows
			}
		}
	}
	if ch.heldSet {
		n.held = ch.held
		for _, m := range []map[string]string{s.held, n.held} {
			for name := range m {
				if _, ok := dirty[name]; !ok && s.clusters[name] != nil && s.clusters[name].held != n.held[name] {
					dirty[name] = s.clusters[name].rows
				}
			}
		}
	}

	resolve := ch.aliasesSet
	rows := s.aliases.rows
	if ch.aliasesSet {
		rows = ch.aliases
	}
	n.rebuilt = slices.Sorted(maps.Keys(dirty))
	for _, name := range n.rebuilt {
		old := s.clusters[name]
		var cb *clusterBuild
		if len(dirty[name]) > 0 {
			cb = buildCluster(s.set, n.view, n.held[name], name, dirty[name])
		}
		if old != nil {
			n.drop(old)
		}
		if cb == nil {
			delete(n.clusters, name)
		} else {
			n.add(cb)
		}
		// An alias may point to the cluster, share its name, or be too
		// long for its longest name.
		if old.served() != cb.served() || old.served() && old.longest != cb.longest {
			resolve = true
		}
	}
	if resolve {
		for _, a := range s.aliases.resolved {
			for _, z := range s.set.zones {
				delete(n.parts, under(a.alias, z))
			}
		}
		n.aliases = resolveAliases(rows, n.clusters, s.set)
		n.aliasesChanged = true
		n.hash += n.aliases.hash - s.aliases.hash
		for r, k := range s.aliases.skips {
			n.skips[r] -= k
		}
		for r, k := range n.aliases.skips {
			n.skips[r] += k
		}
		for _, a := range n.aliases.resolved {
			for _, z := range s.set.zones {
				ap := &aliasPart{target: under(a.target, z), final: under(a.final, z)}
				if a.failover {
					owner := labelFailover + "." + under(a.alias, z)
					ap.state = &entry{owner: owner, txt: &dns.TXT{Hdr: hdr(owner, dns.TypeTXT, s.set.ttl), Txt: failoverTXT(a)}}
				}
				n.parts[under(a.alias, z)] = &part{alias: ap}
			}
		}
	}
	// Placed last: a cluster's part takes the name of an alias that no
	// longer resolves because the cluster has its name.
	for _, name := range n.rebuilt {
		if cb := n.clusters[name]; cb != nil {
			for i, z := range s.set.zones {
				if cb.parts != nil {
					n.parts[under(name, z)] = cb.parts[i]
				}
			}
		}
	}
	for r, k := range n.skips {
		if k == 0 {
			delete(n.skips, r)
		}
	}
	if n.targetsDiffer(s) {
		n.targetsChanged = true
		n.targets = nil
		for _, name := range slices.Sorted(maps.Keys(n.clusters)) {
			n.targets = append(n.targets, n.clusters[name].targets...)
		}
	}
	return n
}

// drop takes an old cluster's names and sums out of n.
func (n *snapshot) drop(cb *clusterBuild) {
	if cb.served() {
		for _, z := range n.set.zones {
			delete(n.parts, under(cb.name, z))
		}
	}
	n.hash -= cb.hash
	n.failOpen -= cb.failOpen
	if cb.stat.split() {
		n.split--
	}
	if cb.stat.held != "" {
		n.heldN--
	}
	for _, sk := range cb.skipped {
		n.skips[sk.reason]--
	}
}

// add puts a cluster built again into n's sums; its parts are placed by next.
func (n *snapshot) add(cb *clusterBuild) {
	n.clusters[cb.name] = cb
	n.hash += cb.hash
	n.failOpen += cb.failOpen
	if cb.stat.split() {
		n.split++
	}
	if cb.stat.held != "" {
		n.heldN++
	}
	for _, sk := range cb.skipped {
		n.skips[sk.reason]++
	}
}

// targetsDiffer reports whether a cluster built for n checks other nodes
// than the same cluster in s.
func (n *snapshot) targetsDiffer(s *snapshot) bool {
	for _, name := range n.rebuilt {
		var was, is []health.Target
		if cb := s.clusters[name]; cb != nil {
			was = cb.targets
		}
		if cb := n.clusters[name]; cb != nil {
			is = cb.targets
		}
		if !slices.Equal(was, is) {
			return true
		}
	}
	return false
}

// changedClusters returns the clusters of the nodes whose verdicts differ
// between two views. When the probe ran does not count (TXT shows it as of
// the cluster's last build), nor do WAL positions (a primary's standbys'
// replay positions and lags with them) unless max_lag uses them.
func changedClusters(was, is health.View, wal bool) map[string]bool {
	out := map[string]bool{}
	differ := func(key string) bool {
		a, aok := was.Get(key)
		b, bok := is.Get(key)
		return aok != bok || aok && !a.Equal(b, wal)
	}
	if keys, ok := is.Changed(was); ok {
		// One made from the other by a few changes: only those can differ.
		for _, key := range keys {
			if !out[clusterOf(key)] && differ(key) {
				out[clusterOf(key)] = true
			}
		}
		return out
	}
	for key := range is.All() {
		if differ(key) {
			out[clusterOf(key)] = true
		}
	}
	for key := range was.All() {
		if _, ok := is.Get(key); !ok {
			out[clusterOf(key)] = true
		}
	}
	return out
}

// clusterOf is the cluster of a node's key, "cluster/name".
func clusterOf(key string) string {
	c, _, _ := strings.Cut(key, "/")
	return c
}

// zoneLen is the length on the wire, in octets, of the longest zone.
func (s *settings) zoneLen() int {
	n := 0
	for _, z := range s.zones {
		n = max(n, len(z)+1)
	}
	return n
}

// find returns the part that name, a name in zone, is in, and the prefix
// name has before the part's own name; nil when no part holds it.
func (s *snapshot) find(name, zone string) (*part, string) {
	key, prefix := name, ""
	if len(name) > len(zone) {
		cut := len(name) - len(zone)
		if zone == "." {
			cut = len(name)
		}
		i := strings.LastIndexByte(name[:cut-1], '.') + 1
		key, prefix = name[i:], name[:i]
	}
	return s.parts[key], prefix
}

// lookup returns name's entry; for a name under an alias, the entry of the
// same prefix under the alias's final cluster, and the alias.
func (s *snapshot) lookup(name, zone string) (*entry, *aliasPart, string) {
	p, prefix := s.find(name, zone)
	switch {
	case p == nil:
		return nil, nil, ""
	case p.alias != nil && p.alias.state != nil && prefix == labelFailover+".":
		return p.alias.state, nil, prefix
	case p.alias != nil:
		return s.parts[p.alias.final].entry(prefix), p.alias, prefix
	}
	return p.entry(prefix), nil, prefix
}

// verdict says of a node ("cluster/name") whether it is served, and why;
// "" when the snapshot has no such node.
func (s *snapshot) verdict(key string) string {
	c, name, _ := strings.Cut(key, "/")
	if cb := s.clusters[c]; cb != nil {
		return cb.verdicts[name]
	}
	return ""
}

// hasNode reports whether a cluster of s has a node of that name.
func (s *snapshot) hasNode(name string) bool {
	for _, cb := range s.clusters {
		if _, ok := cb.verdicts[name]; ok {
			return true
		}
	}
	return false
}

// servedClusters counts the clusters with names.
func (s *snapshot) servedClusters() int {
	n := 0
	for _, cb := range s.clusters {
		if cb.served() {
			n++
		}
	}
	return n
}

// setSerial writes the SOA record of every zone apex with serial: MNAME
// the first name server, the timers of the soa option or their defaults
// (ttl, the zone's TTL, is then the negative TTL).
func (s *snapshot) setSerial(serial uint32, ttl uint32) {
	s.serial = serial
	t := s.set.soa.orDefault(ttl)
	for _, z := range s.set.zones {
		old := s.parts[z].self
		apex := &entry{owner: old.owner, a: old.a, aaaa: old.aaaa, srv: old.srv, txt: old.txt, failOpen: old.failOpen, ent: old.ent,
			apex: &apexRecords{ns: old.apex.ns, glue: old.apex.glue}}
		apex.apex.soa = &dns.SOA{
			Hdr:     hdr(z, dns.TypeSOA, t.negative),
			Ns:      apex.apex.ns[0].(*dns.NS).Ns,
			Mbox:    under("hostmaster", z),
			Serial:  serial,
			Refresh: t.refresh,
			Retry:   t.retry,
			Expire:  t.expire,
			Minttl:  t.negative,
		}
		s.parts[z] = newPart(map[string]*entry{"": apex})
	}
}
