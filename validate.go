package pgcluster

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/printable"
)

// Skip reasons, the values of the rows_skipped metric's reason label.
const (
	skipInvalidName  = "invalid_name"
	skipReservedName = "reserved_name"
	skipDuplicate    = "duplicate"
	skipAliasLoop    = "alias_loop"
	// skipInvalidFallback: a fallback an alias can never fail over to;
	// the alias itself serves.
	skipInvalidFallback = "invalid_fallback"
	skipAliasDangling   = "alias_dangling"
	skipAliasTooDeep    = "alias_too_deep"
	skipNameTooLong     = "name_too_long"
	// skipInvalidPlace: a region or zone that is not a DNS label; the row
	// is served without it (its place unknown), the network row not at all.
	skipInvalidPlace = "invalid_place"
)

// skipped is a row that could not be served, and why.
type skipped struct {
	reason string
	what   string
}

func (s skipped) String() string { return s.what + " (" + s.reason + ")" }

// member is a node that passed validation, with its verdict.
type member struct {
	Node
	addr    netip.Addr // the address to advertise
	serving bool
	reason  string // a stable word: see verdict.go
	detail  string // for TXT: what a person reads, numbers included

	// With checks on: the check's verdict (the zero Verdict, Unknown, when
	// not checked yet), whether the registry alone would serve the node, and
	// the replication lag behind the cluster's primary (lag < 0: unknown).
	check      health.Verdict
	registryOK bool
	lag        int64
	lagging    bool           // lag over max_lag: out of standby. and prefer-standby.
	target     netip.AddrPort // where the check connects; invalid: not checked
	// stale: a primary on an older timeline than another of the same
	// system (split_brain newest_timeline): answered nowhere, fail-open
	// included.
	stale bool
	// replica is how the cluster's one primary sees this standby in
	// pg_stat_replication (see judgeReplicas); nil when it does not list
	// it, or when no primary's list is known (cluster.replicas says why).
	replica *health.Replica
	// replicas is the cluster's replicas, for this member's TXT.
	replicas string
	// placeIgnored says, for TXT, which of the row's region and zone was
	// not a DNS label and is ignored; "" when none.
	placeIgnored string
}

// cluster is one cluster's validated members.
type cluster struct {
	name    string
	members []*member
	// primaries are the serving members that claim to be primary (see
	// judgePrimaries): primary. has an address only when there is one.
	primaries []*member
	// replicas says whether the standbys' places in the primary's
	// pg_stat_replication are known (see judgeReplicas).
	replicas string
}

// Bounds of owner names, in octets on the wire (RFC 1035 3.1): a name
// holds at most 255, and the longest prefix pgcluster puts before a set's
// name is "_postgresql._tcp.prefer-standby.".
const (
	maxNameLen   = 255
	setPrefixLen = len(labelSRV) + 1 + len(labelPreferStandby) + 1
)

// longest is the longest prefix of a name under the cluster, in octets on
// the wire: a set's SRV name or a node's name.
func (c *cluster) longest() int {
	n := setPrefixLen
	for _, m := range c.members {
		n = max(n, len(m.Name)+1)
	}
	return n
}

// validate drops the cluster's rows that cannot be served and decides
// which of the rest serve; nil when none is left.
func (cb *clusterBuild) validate(in buildInput, zoneLen int) *cluster {
	nodes := slices.Clone(cb.rows)
	// Sort by name as served; of two rows that differ only in case, the one
	// already in lower case wins.
	key := func(n Node) string { return strings.ToLower(n.Cluster) + "/" + strings.ToLower(n.Name) }
	canonical := func(n Node) bool { return n.Cluster+"/"+n.Name == key(n) }
	sort.SliceStable(nodes, func(i, j int) bool {
		if ki, kj := key(nodes[i]), key(nodes[j]); ki != kj {
			return ki < kj
		}
		return canonical(nodes[i]) && !canonical(nodes[j])
	})
	c := &cluster{name: cb.name}
	cl := cb.name
	seen := map[string]bool{}
	for _, n := range nodes {
		nl := strings.ToLower(n.Name)
		reason, why := "", ""
		switch {
		case !isLabel(cl) || !isLabel(nl):
			reason = skipInvalidName
		case in.reservedZoneLabel(cl) || reservedInCluster[nl]:
			reason = skipReservedName
		case seen[nl]:
			reason = skipDuplicate
		case zoneLen+len(nl)+1+len(cl)+1 > maxNameLen || zoneLen+setPrefixLen+len(cl)+1 > maxNameLen:
			reason, why = skipNameTooLong, ": its names would be longer than 255 octets"
		}
		if reason != "" {
			cb.skipped = append(cb.skipped, skipped{reason: reason, what: fmt.Sprintf("node %q in cluster %q%s", n.Name, n.Cluster, why)})
			continue
		}
		seen[nl] = true
		n.Cluster, n.Name, n.Role = cl, nl, printable.Cut(strings.ToLower(strings.TrimSpace(n.Role)), maxRole)
		var ignored string
		n.Region, n.Zone, ignored = checkPlace(n.Region, n.Zone)
		if ignored != "" {
			cb.skipped = append(cb.skipped, skipped{reason: skipInvalidPlace,
				what: fmt.Sprintf("%s of node %q in cluster %q: served without it", ignored, n.Name, n.Cluster)})
		}
		m := judge(n, in)
		m.placeIgnored = ignored
		c.members = append(c.members, m)
		// Only nodes the registry allows are checked: no instance connects
		// to a node the registry marks unhealthy (or stale, or otherwise
		// out), which its check could not bring back.
		if in.checksOn() && m.target.IsValid() && m.registryOK {
			cb.targets = append(cb.targets, health.Target{Key: cl + "/" + nl, Addr: m.target})
		}
	}
	if len(c.members) == 0 {
		return nil
	}
	if in.splitBrain == splitBrainNewestTimeline {
		c.judgeTimelines()
	}
	c.judgePrimaries()
	c.judgeReplicas()
	if in.maxLag > 0 {
		c.judgeLag(in.maxLag)
	}
	if in.maxLagTime > 0 {
		c.judgeReplayLag(in.maxLagTime)
	}
	cb.verdicts = make(map[string]string, len(c.members))
	for _, m := range c.members {
		cb.verdicts[m.Name] = m.verdict()
		switch {
		case m.serving && m.Drain.drained():
			cb.stat.drained++
		case m.serving:
			cb.stat.serving++
		default:
			cb.stat.out++
		}
		if pl := (place{m.Region, m.Zone}); in.topologyOn() && pl != (place{}) {
			if cb.stat.placeServing == nil {
				cb.stat.placeServing = map[place]int{}
			}
			n := 0
			if m.serving && !m.Drain.drained() {
				n = 1
			}
			cb.stat.placeServing[pl] += n // a place with none still counts, as 0
		}
	}
	for _, m := range c.primaries {
		cb.stat.primaries = append(cb.stat.primaries, m.Name)
	}
	if p := c.promoted(); p != nil {
		cb.stat.promoted = p.Name
	}
	return c
}

// checkPlace returns a row's region and zone as served, in lower case: each
// one that is not a DNS label is dropped (unknown), and ignored says which,
// with its value shown safely.
func checkPlace(region, zone string) (string, string, string) {
	var bad []string
	check := func(what, v string) string {
		l := strings.ToLower(v)
		if v == "" || isLabel(l) {
			return l
		}
		bad = append(bad, fmt.Sprintf("%s %q is not a DNS label", what, printable.Cut(v, maxRole)))
		return ""
	}
	region, zone = check("region", region), check("zone", zone)
	return region, zone, strings.Join(bad, ", ")
}

// resolvedAlias is an alias whose chain ends at a cluster.
type resolvedAlias struct {
	alias, target, final string
	depth                int
	// row is the alias's row, for its fail-over state (failoverTXT);
	// failover says whether it has one to show: fallbacks, or a move.
	row      Alias
	failover bool
}

// aliasBuild is the aliases of a snapshot, resolved.
type aliasBuild struct {
	rows     []Alias // as given
	resolved []resolvedAlias
	skipped  []skipped
	skips    map[string]int // by reason
	hash     uint64
}

// resolveAliases follows every alias to its cluster (one that serves names:
// clusters holds every cluster by served name) and orders them so that an
// alias comes after the alias it points to. An alias may not take a name
// server's label (set.reservedZoneLabel).
func resolveAliases(rows []Alias, clusters map[string]*clusterBuild, set *settings) *aliasBuild {
	ab := &aliasBuild{rows: rows, skips: map[string]int{}}
	zoneLen := set.zoneLen()
	served := func(name string) *clusterBuild {
		if cb := clusters[name]; cb.served() {
			return cb
		}
		return nil
	}
	target := map[string]string{}
	rows = slices.Clone(rows)
	// Of two aliases that differ only in case, the one already in lower case
	// wins, as for nodes.
	sort.SliceStable(rows, func(i, j int) bool {
		ai, aj := strings.ToLower(rows[i].Alias), strings.ToLower(rows[j].Alias)
		if ai != aj {
			return ai < aj
		}
		return rows[i].Alias == ai && rows[j].Alias != aj
	})
	what := func(r Alias) string { return fmt.Sprintf("alias %q -> %q", r.Alias, r.effective()) }
	for _, r := range rows {
		a, t := strings.ToLower(r.Alias), strings.ToLower(strings.TrimSuffix(r.effective(), "."))
		switch {
		case !isLabel(a) || !isLabel(t):
			ab.skip(skipInvalidName, what(r))
		case set.reservedZoneLabel(a):
			ab.skip(skipReservedName, what(r))
		case served(a) != nil:
			ab.skip(skipDuplicate, what(r)+": a cluster has that name")
		case target[a] != "":
			ab.skip(skipDuplicate, what(r))
		default:
			target[a] = t
		}
	}
	ends := aliasEnds(target, func(name string) bool { return served(name) != nil })
	resolved := map[string]bool{}
	for _, r := range rows {
		a := strings.ToLower(r.Alias)
		t, ok := target[a]
		if !ok || resolved[a] {
			continue
		}
		resolved[a] = true
		e := ends[a]
		switch {
		case e.loop:
			ab.skip(skipAliasLoop, what(r))
			continue
		case e.missing != "":
			ab.skip(skipAliasDangling, what(r)+": no cluster or alias "+e.missing)
			continue
		case e.depth > maxChain:
			ab.skip(skipAliasTooDeep, fmt.Sprintf("%s: more than %d aliases to a cluster", what(r), maxChain))
			continue
		}
		c := served(e.final)
		if zoneLen+c.longest+len(a)+1 > maxNameLen {
			ab.skip(skipNameTooLong, what(r)+": its names would be longer than 255 octets")
			continue
		}
		ab.resolved = append(ab.resolved, resolvedAlias{alias: a, target: t, final: e.final, depth: e.depth,
			row: r, failover: r.Fallback != "" || r.Moved != ""})
		ab.vetFallbacks(r, target, func(name string) bool { return served(name) != nil })
	}
	sort.SliceStable(ab.resolved, func(i, j int) bool { return ab.resolved[i].depth < ab.resolved[j].depth })
	h := fnv.New64a()
	for _, a := range ab.resolved {
		fmt.Fprintf(h, "%s>%s\n", a.alias, a.target)
		// Its fail-over state, when it has one: without, the hash is the
		// one aliases had before fail-over.
		if a.failover {
			r := a.row
			fmt.Fprintf(h, "failover %s %s %s %v %s %s %q %d\n", r.Target, r.Fallback, r.when(), r.after(), r.Failback, r.Moved, r.Why, r.MovedAt)
		}
	}
	ab.hash = h.Sum64()
	return ab
}

// aliasEnd is where an alias's chain ends: at the cluster final, depth
// aliases away (1: the alias names it), in a loop, or at a name that is
// neither a cluster nor an alias (missing).
type aliasEnd struct {
	final   string
	depth   int
	loop    bool
	missing string
}

// aliasEnds follows every alias of target (alias -> target, both in lower
// case) to where its chain ends, however long: a chain that comes back on
// itself is a loop at any length, and one that leads into a loop is
// reported as one too. Each alias is followed once (the ends found are
// kept), so a registry of n aliases costs O(n).
func aliasEnds(target map[string]string, cluster func(string) bool) map[string]aliasEnd {
	ends := make(map[string]aliasEnd, len(target))
	onPath := map[string]bool{}
	for a := range target {
		var path []string
		var e aliasEnd
		for cur := a; ; cur = target[cur] {
			if known, ok := ends[cur]; ok {
				e = known
				break
			}
			if cluster(cur) {
				e = aliasEnd{final: cur}
				break
			}
			if _, ok := target[cur]; !ok {
				e = aliasEnd{missing: cur}
				break
			}
			if onPath[cur] {
				e = aliasEnd{loop: true}
				break
			}
			onPath[cur] = true
			path = append(path, cur)
		}
		for i := len(path) - 1; i >= 0; i-- {
			if e.final != "" {
				e.depth++
			}
			ends[path[i]] = e
			delete(onPath, path[i])
		}
	}
	return ends
}

// vetFallbacks notes, as skipped with invalid_fallback, each fallback of r
// that the alias can never fail over to: not a label, the alias itself,
// its own target or an earlier fallback again, or an alias (a fallback is
// a cluster: an alias could lead back). The alias serves all the same, with
// the fallbacks that remain. One naming a cluster that serves no names now
// is noted too, as a warning: it is kept, and used once it serves.
func (ab *aliasBuild) vetFallbacks(r Alias, aliases map[string]string, cluster func(string) bool) {
	seen := fallbacksSeen(r)
	for _, f := range r.fallbacks() {
		lf := strings.ToLower(f)
		switch why := unusableFallback(r, f, func(l string) bool { return aliases[l] != "" }, seen); {
		case why != "":
			ab.skip(skipInvalidFallback, fmt.Sprintf("fallback %q of alias %q: %s (not used)", f, r.Alias, why))
		case !cluster(lf):
			ab.skip(skipInvalidFallback, fmt.Sprintf("fallback %q of alias %q: no cluster %q serves now (kept: used once it does)", f, r.Alias, lf))
		}
	}
}

// fallbacksSeen is what the first fallback of r may not be again: the
// alias and its target, in lower case (see unusableFallback).
func fallbacksSeen(r Alias) map[string]bool {
	return map[string]bool{strings.ToLower(r.Alias): true, strings.ToLower(r.Target): true}
}

// unusableFallback says why alias r can never fail over to its fallback f,
// the one after those in seen (which f joins): "" when it can. The rules
// of vetFallbacks, which logs them, and of usableFallback, which decides.
func unusableFallback(r Alias, f string, isAlias func(string) bool, seen map[string]bool) string {
	lf := strings.ToLower(f)
	defer func() { seen[lf] = true }()
	switch {
	case !isLabel(lf):
		return "not a DNS label"
	case lf == strings.ToLower(r.Alias):
		return "the alias itself"
	case seen[lf]:
		return "named twice, or the alias's own target"
	case isAlias(lf):
		return "an alias: a fallback is a cluster"
	}
	return ""
}

// usableFallback reports whether the alias may fail over to f, the first
// time it names it (see vetFallbacks).
func usableFallback(r Alias, f string, aliases map[string]bool) bool {
	seen := fallbacksSeen(r)
	for _, g := range r.fallbacks() {
		why := unusableFallback(r, g, func(l string) bool { return aliases[l] }, seen)
		if g == f {
			return why == ""
		}
	}
	return false
}

func (ab *aliasBuild) skip(reason, what string) {
	ab.skipped = append(ab.skipped, skipped{reason: reason, what: what})
	ab.skips[reason]++
}
