package pgcluster

import (
	"maps"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Node is one row of pgcluster_nodes, as loaded.
type Node struct {
	Cluster string
	Name    string
	Address netip.Addr
	// Network is set when the registry stored the address with a mask
	// shorter than a host's (inet '10.1.0.0/16'): a network, never served.
	Network netip.Prefix
	Port    int
	Role    string
	Healthy bool
	// HeartbeatAge is how old the heartbeat was when the row was read,
	// measured by PostgreSQL's own clock. Heartbeats too old or too far in
	// the future for a time.Duration are clamped to its bounds.
	HeartbeatAge time.Duration
	// Heartbeat is the heartbeat itself, as stored: shown for a node judged
	// stale, since it does not change while its age does. Zero when it is
	// not a moment (NULL, or infinite in a registry older than the checks
	// that refuse it).
	Heartbeat time.Time
	// Region and Zone are where the node runs (topology.kubernetes.io's
	// vocabulary); "" when the registry does not say (NULL).
	Region string
	Zone   string
	// Drain is the drain the node was read with; the zero Drain when none.
	Drain Drain
}

// Drain is a drain of pgcluster_drains that holds a node: out of every
// shared name, kept under its own, with a reason.
type Drain struct {
	ID     int64 // 0: not drained
	Reason string
	By     string
	// Until is when the drain ends, Unix µs, as PostgreSQL stored it; 0
	// when it has no end.
	Until int64
	// EndsAt is when it ends on this instance's clock: the time left by
	// PostgreSQL's clock when it was read, from then. The follower reads
	// the node again at that moment. Zero without an end, and in rows
	// that came through the relay (whose follower reads them again).
	EndsAt time.Time
}

// drained reports whether the node is drained.
func (d Drain) drained() bool { return d.ID != 0 }

// Alias is one row of pgcluster_aliases, with where it points now when
// it failed over (pgcluster_alias_state).
type Alias struct {
	Alias  string
	Target string
	// Fallback lists, in order and separated by commas (labels have
	// none), the targets the alias may fail over to; "" when none.
	Fallback string
	// When is what makes a target not serve: failNoPrimary or
	// failNoNodes; After, for how long before the alias moves; Failback,
	// failbackManual or failbackAuto. Zero values are the defaults
	// (registries and copies made before fail-over).
	When     string
	After    time.Duration
	Failback string
	// Moved is the target the alias failed over to ("" when it points at
	// Target), Why what its row says of the move, and MovedAt when it
	// was made, Unix µs by PostgreSQL's clock.
	Moved   string
	Why     string
	MovedAt int64
}

// Fail-over settings of an alias (pgcluster_aliases).
const (
	failNoPrimary  = "no_primary"
	failNoNodes    = "no_nodes"
	failbackManual = "manual"
	failbackAuto   = "auto"
	// defaultFailoverAfter is failover_after's default.
	defaultFailoverAfter = 30 * time.Second
)

// fallbacks is the alias's fail-over list, in order.
func (a Alias) fallbacks() []string {
	if a.Fallback == "" {
		return nil
	}
	return strings.Split(a.Fallback, ",")
}

// targets is every target the alias may point at, in order: its target,
// then its fallbacks.
func (a Alias) targets() []string { return append([]string{a.Target}, a.fallbacks()...) }

// effective is the target the alias points at: the one it moved to, when
// that is still one of its targets past the first, else its target.
func (a Alias) effective() string {
	if a.Moved != "" && !strings.EqualFold(a.Moved, a.Target) && slices.ContainsFunc(a.fallbacks(), func(f string) bool { return strings.EqualFold(f, a.Moved) }) {
		return a.Moved
	}
	return a.Target
}

// when and after are the alias's fail-over criterion and delay, defaults
// filled in.
func (a Alias) when() string {
	if a.When == "" {
		return failNoPrimary
	}
	return a.When
}

func (a Alias) after() time.Duration {
	if a.When == "" && a.After == 0 {
		return defaultFailoverAfter
	}
	return a.After
}

// Network is one row of pgcluster_networks: clients in Network are in
// Region and Zone ("" when NULL). Of networks that overlap, the longest
// prefix holding a client places it.
type Network struct {
	Network netip.Prefix
	Region  string
	Zone    string
}

// Roles and the reserved labels inside a cluster.
const (
	rolePrimary = "primary"
	roleStandby = "standby"

	labelPrimary       = "primary"
	labelStandby       = "standby"
	labelReplica       = "replica"
	labelPreferStandby = "prefer-standby"
	labelSync          = "sync"
	labelSRV           = "_postgresql._tcp"
	labelNS            = "ns"
)

// reservedInCluster are labels a node may not take.
var reservedInCluster = map[string]bool{
	labelPrimary: true, labelStandby: true, labelReplica: true, labelPreferStandby: true, labelSync: true,
}

// isLabel reports whether s is a host name label: letters, digits and inner
// hyphens, at most 63 characters.
func isLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// rowsUpdate is what one read of the registry brings, from PostgreSQL
// (registry.go) or from the fleet's copy (relay.go), to the publisher.
// Its rows are shared, never changed, once made.
type rowsUpdate struct {
	// nodes holds, by served cluster (the cluster in lower case), every row
	// the cluster has now; a cluster given without rows has none left.
	nodes map[string][]Node
	// full: nodes holds every cluster; those it lacks have no rows left.
	full bool
	// aliases holds every alias, when aliasesSet.
	aliases    []Alias
	aliasesSet bool
	// networks holds every network, when networksSet.
	networks    []Network
	networksSet bool
	// loadedAt is when the rows were read (earlier than now when they are
	// the last instance's, restored after a Corefile reload).
	loadedAt time.Time

	// version is the fleet's registry version these rows are, when they
	// came through the registry relay (relay.go): the SOA serial, the same
	// on every instance for the same registry content. 0 when they were
	// read here from PostgreSQL without the relay.
	version int64
	// readAt is when the read that brought them began: for a read that a
	// notification asked for, just after the COMMIT. The relay's lag
	// starts there.
	readAt time.Time
}

// rowsChanged calls changed with each served cluster whose rows u
// changes in a way an answer shows (see sameRows), against held, the
// clusters held now (their rows given by rows). This is the one place that
// decides whether a cluster changed.
func rowsChanged[V any](u *rowsUpdate, held map[string]V, rows func(V) []Node, staleAfter time.Duration, changed func(name string)) {
	for name, ns := range u.nodes {
		if old, ok := held[name]; !ok && len(ns) > 0 || ok && !sameRows(rows(old), ns, staleAfter) {
			changed(name)
		}
	}
	if u.full {
		for name := range held {
			if _, ok := u.nodes[name]; !ok {
				changed(name)
			}
		}
	}
}

// sameRows reports whether two row sets of a cluster make the same names:
// equal but for how old their heartbeats are, as long as stale_after judges
// them alike (the heartbeat's time shows only for a node it judges stale),
// and for when, on this instance's clock, their drains end.
func sameRows(a, b []Node, staleAfter time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		fx, fy := 0, 0
		if staleAfter > 0 {
			fx, fy = freshness(x.HeartbeatAge, staleAfter), freshness(y.HeartbeatAge, staleAfter)
		}
		if fx != fy || fx != 0 && !x.Heartbeat.Equal(y.Heartbeat) {
			return false
		}
		x.HeartbeatAge, y.HeartbeatAge, x.Heartbeat, y.Heartbeat = 0, 0, time.Time{}, time.Time{}
		// When a drain ends is read anew at every read: what it changes
		// is when the node is read again, not an answer.
		x.Drain.EndsAt, y.Drain.EndsAt = time.Time{}, time.Time{}
		if x != y {
			return false
		}
	}
	return true
}

// freshness is how stale_after judges a heartbeat: 0 fresh, 1 stale, -1
// in the future beyond it.
func freshness(age, staleAfter time.Duration) int {
	switch {
	case age > staleAfter:
		return 1
	case age < -staleAfter:
		return -1
	}
	return 0
}

// groupNodes sorts rows into their served clusters, each in a slice of
// exactly its size: they are kept as long as the cluster does not change.
func groupNodes(nodes []Node) map[string][]Node {
	counts := map[string]int{}
	for _, n := range nodes {
		counts[strings.ToLower(n.Cluster)]++
	}
	out := make(map[string][]Node, len(counts))
	for _, n := range nodes {
		c := strings.ToLower(n.Cluster)
		if out[c] == nil {
			out[c] = make([]Node, 0, counts[c])
		}
		out[c] = append(out[c], n)
	}
	return out
}

// sortNodes orders a cluster's rows by cluster and name as stored: the
// order in which two reads of the same rows are compared.
func sortNodes(ns []Node) {
	slices.SortFunc(ns, func(a, b Node) int {
		if c := strings.Compare(a.Cluster, b.Cluster); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
}

// rowSet is the registry as followed: each served cluster's nodes (every
// row whose cluster is that name in lower case) with the time their
// heartbeat ages were measured, and the aliases. Its maps are replaced,
// never changed, once handed out (lastLoads keeps them).
type rowSet struct {
	clusters map[string]clusterRows
	aliases  map[string]Alias // by alias as stored
	networks []Network        // by network (see sortNetworks)
}

type clusterRows struct {
	nodes []Node    // by cluster and name as stored
	at    time.Time // when the nodes' HeartbeatAge were measured
}

// aged returns a cluster's nodes with their heartbeat ages as of now: the
// nodes themselves when they were read then (never changed once read: a
// later read makes new ones), so that the publisher shares them. Ages that
// stand for infinite heartbeats stay as they are.
func (c clusterRows) aged(now time.Time) []Node {
	d := now.Sub(c.at)
	if d == 0 {
		return c.nodes
	}
	out := slices.Clone(c.nodes)
	for i, n := range out {
		out[i].HeartbeatAge = ageBy(n.HeartbeatAge, d)
	}
	return out
}

// ageBy is age d later.
func ageBy(age, d time.Duration) time.Duration {
	if age == math.MaxInt64 || age == math.MinInt64 {
		return age
	}
	return satAdd(age, d)
}

// satAdd adds without overflowing past the bounds that stand for infinity.
func satAdd(a, b time.Duration) time.Duration {
	s := a + b
	switch {
	case b > 0 && s < a:
		return math.MaxInt64
	case b < 0 && s > a:
		return math.MinInt64
	}
	return s
}

// aliasList returns the aliases by alias as stored.
func (rs *rowSet) aliasList() []Alias {
	out := make([]Alias, 0, len(rs.aliases))
	for _, a := range slices.Sorted(maps.Keys(rs.aliases)) {
		out = append(out, rs.aliases[a])
	}
	return out
}

// update returns all of rs as a full update loaded at loadedAt, its
// heartbeat ages as they were measured.
func (rs *rowSet) update(loadedAt time.Time) rowsUpdate {
	u := rowsUpdate{full: true, nodes: make(map[string][]Node, len(rs.clusters)), aliases: rs.aliasList(), aliasesSet: true,
		networks: rs.networks, networksSet: true, loadedAt: loadedAt}
	for name, c := range rs.clusters {
		u.nodes[name] = c.nodes
	}
	return u
}

// full replaces everything with a full read made at "at".
func (rs *rowSet) full(nodes []Node, aliases []Alias, networks []Network, at time.Time) {
	rs.clusters = map[string]clusterRows{}
	rs.aliases = map[string]Alias{}
	rs.networks = sortNetworks(networks)
	for c, ns := range groupNodes(nodes) {
		sortNodes(ns)
		rs.clusters[c] = clusterRows{nodes: ns, at: at}
	}
	for _, a := range aliases {
		rs.aliases[a.Alias] = a
	}
}

// replace puts the rows read at "at" of the clusters and aliases named (as
// stored) in place of the ones held (absent from the read: deleted), and
// the networks read, when networksRead, in place of all of them; it returns
// the served clusters that changed.
func (rs *rowSet) replace(clusters, aliases map[string]bool, nodes []Node, as []Alias, networks []Network, networksRead bool, at time.Time) map[string]bool {
	if networksRead {
		rs.networks = sortNetworks(networks)
	}
	changed := map[string]bool{}
	if len(clusters) > 0 {
		rs.clusters = maps.Clone(rs.clusters)
		read := groupNodes(nodes)
		for c := range clusters {
			changed[strings.ToLower(c)] = true
		}
		for c := range changed {
			// Other spellings of the cluster keep their rows, aged to "at".
			old := rs.clusters[c]
			var ns []Node
			for _, n := range old.nodes {
				if !clusters[n.Cluster] {
					n.HeartbeatAge = ageBy(n.HeartbeatAge, at.Sub(old.at))
					ns = append(ns, n)
				}
			}
			ns = append(ns, read[c]...)
			if len(ns) == 0 {
				delete(rs.clusters, c)
				continue
			}
			sortNodes(ns)
			rs.clusters[c] = clusterRows{nodes: ns, at: at}
		}
	}
	if len(aliases) > 0 {
		rs.aliases = maps.Clone(rs.aliases)
		for a := range aliases {
			delete(rs.aliases, a)
		}
		for _, a := range as {
			rs.aliases[a.Alias] = a
		}
	}
	return changed
}

// setAges replaces every node's heartbeat age with one read at "at", by
// "cluster/name" as stored; nodes the read does not have keep theirs, aged
// (they left meanwhile, and a notification says so).
func (rs *rowSet) setAges(ages map[string]time.Duration, at time.Time) {
	clusters := make(map[string]clusterRows, len(rs.clusters))
	for name, c := range rs.clusters {
		d := at.Sub(c.at)
		nodes := slices.Clone(c.nodes)
		for i, n := range nodes {
			if a, ok := ages[n.Cluster+"/"+n.Name]; ok {
				nodes[i].HeartbeatAge = a
			} else {
				nodes[i].HeartbeatAge = ageBy(n.HeartbeatAge, d)
			}
		}
		clusters[name] = clusterRows{nodes: nodes, at: at}
	}
	rs.clusters = clusters
}

// merge puts what u brings into rs (its maps replaced, never changed: see
// rowSet), as of at.
func (rs *rowSet) merge(u rowsUpdate, at time.Time) {
	if u.full || rs.clusters == nil {
		rs.clusters = make(map[string]clusterRows, len(u.nodes))
	} else {
		rs.clusters = maps.Clone(rs.clusters)
	}
	for name, ns := range u.nodes {
		if len(ns) == 0 {
			delete(rs.clusters, name)
			continue
		}
		rs.clusters[name] = clusterRows{nodes: ns, at: at}
	}
	if u.aliasesSet || u.full {
		rs.aliases = make(map[string]Alias, len(u.aliases))
		for _, a := range u.aliases {
			rs.aliases[a.Alias] = a
		}
	}
	if u.networksSet || u.full {
		rs.networks = sortNetworks(u.networks)
	}
}

// sortNetworks returns a copy of networks ordered by address, then prefix
// length: the order in which two reads of the same rows are compared.
func sortNetworks(networks []Network) []Network {
	out := slices.Clone(networks)
	slices.SortFunc(out, func(a, b Network) int {
		if c := a.Network.Addr().Compare(b.Network.Addr()); c != 0 {
			return c
		}
		return a.Network.Bits() - b.Network.Bits()
	})
	return out
}

// diff returns the served clusters whose rows u changes in a way an answer
// shows (see rowsChanged), and whether it changes the aliases or the
// networks.
func (rs *rowSet) diff(u rowsUpdate, staleAfter time.Duration) (map[string]bool, bool, bool) {
	changed := map[string]bool{}
	rowsChanged(&u, rs.clusters, func(c clusterRows) []Node { return c.nodes }, staleAfter, func(name string) { changed[name] = true })
	aliases := false
	if u.aliasesSet {
		now := make(map[string]Alias, len(u.aliases))
		for _, a := range u.aliases {
			now[a.Alias] = a
		}
		aliases = !maps.Equal(now, rs.aliases)
	}
	networks := u.networksSet && !slices.Equal(sortNetworks(u.networks), rs.networks)
	return changed, aliases, networks
}

// drainsEnded returns the clusters, as stored, of the nodes whose drain has
// ended by now: their rows are read again.
func (rs *rowSet) drainsEnded(now time.Time) map[string]bool {
	var out map[string]bool
	for _, c := range rs.clusters {
		for _, n := range c.nodes {
			if e := n.Drain.EndsAt; !e.IsZero() && !now.Before(e) {
				if out == nil {
					out = map[string]bool{}
				}
				out[n.Cluster] = true
			}
		}
	}
	return out
}

// nextDrainEnd is how long from now until the first drain ends, and
// whether one will.
func (rs *rowSet) nextDrainEnd(now time.Time) (time.Duration, bool) {
	var first time.Time
	for _, c := range rs.clusters {
		for _, n := range c.nodes {
			if e := n.Drain.EndsAt; !e.IsZero() && (first.IsZero() || e.Before(first)) {
				first = e
			}
		}
	}
	if first.IsZero() {
		return 0, false
	}
	return max(first.Sub(now), 0), true
}
