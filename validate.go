package pgcluster

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/pgcluster/pgcluster/health"
)

// Skip reasons, the values of the rows_skipped metric's reason label.
const (
	skipInvalidName   = "invalid_name"
	skipReservedName  = "reserved_name"
	skipDuplicate     = "duplicate"
	skipAliasLoop     = "alias_loop"
	skipAliasDangling = "alias_dangling"
	skipAliasTooDeep  = "alias_too_deep"
	skipNameTooLong   = "name_too_long"
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
}

// cluster is one cluster's validated members.
type cluster struct {
	name    string
	members []*member
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

// validateNodes drops rows that cannot be served and decides which of the
// rest serve.
func (s *snapshot) validateNodes(in buildInput, zoneLen int) []*cluster {
	byName := map[string]*cluster{}
	var order []*cluster
	nodes := append([]Node(nil), in.nodes...)
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
	seen := map[string]bool{}
	for _, n := range nodes {
		what := fmt.Sprintf("node %q in cluster %q", n.Name, n.Cluster)
		cl, nl := strings.ToLower(n.Cluster), strings.ToLower(n.Name)
		switch {
		case !isLabel(cl) || !isLabel(nl):
			s.skip(skipInvalidName, what)
			continue
		case cl == labelNS || reservedInCluster[nl]:
			s.skip(skipReservedName, what)
			continue
		case seen[cl+"/"+nl]:
			s.skip(skipDuplicate, what)
			continue
		case zoneLen+len(nl)+1+len(cl)+1 > maxNameLen || zoneLen+setPrefixLen+len(cl)+1 > maxNameLen:
			s.skip(skipNameTooLong, what+": its names would be longer than 255 octets")
			continue
		}
		seen[cl+"/"+nl] = true
		n.Cluster, n.Name, n.Role = cl, nl, printable(strings.ToLower(strings.TrimSpace(n.Role)), maxRole)
		c := byName[cl]
		if c == nil {
			c = &cluster{name: cl}
			byName[cl] = c
			order = append(order, c)
		}
		m := judge(n, in)
		c.members = append(c.members, m)
		if in.checksOn() && m.target.IsValid() {
			s.targets = append(s.targets, health.Target{Key: cl + "/" + nl, Addr: m.target})
		}
	}
	for _, c := range order {
		if in.maxLag > 0 {
			c.judgeLag(in.maxLag)
		}
		st := clusterStat{}
		for _, m := range c.members {
			s.verdicts[c.name+"/"+m.Name] = m.verdict()
			if m.serving {
				st.serving++
				if m.Role == rolePrimary {
					st.primaries = append(st.primaries, m.Name)
				}
			} else {
				st.out++
			}
		}
		s.clusters[c.name] = st
	}
	return order
}

// resolvedAlias is an alias whose chain ends at a cluster.
type resolvedAlias struct {
	alias, target, final string
	depth                int
}

// resolveAliases follows every alias to its cluster and orders them so that
// an alias comes after the alias it points to.
func (s *snapshot) resolveAliases(rows []Alias, clusters []*cluster, zoneLen int) []resolvedAlias {
	byName := map[string]*cluster{}
	for _, c := range clusters {
		byName[c.name] = c
	}
	target := map[string]string{}
	rows = append([]Alias(nil), rows...)
	// Of two aliases that differ only in case, the one already in lower case
	// wins, as for nodes.
	sort.SliceStable(rows, func(i, j int) bool {
		ai, aj := strings.ToLower(rows[i].Alias), strings.ToLower(rows[j].Alias)
		if ai != aj {
			return ai < aj
		}
		return rows[i].Alias == ai && rows[j].Alias != aj
	})
	for _, r := range rows {
		a, t := strings.ToLower(r.Alias), strings.ToLower(strings.TrimSuffix(r.Target, "."))
		what := fmt.Sprintf("alias %q -> %q", r.Alias, r.Target)
		switch {
		case !isLabel(a) || !isLabel(t):
			s.skip(skipInvalidName, what)
		case a == labelNS:
			s.skip(skipReservedName, what)
		case byName[a] != nil:
			s.skip(skipDuplicate, what+": a cluster has that name")
		case target[a] != "":
			s.skip(skipDuplicate, what)
		default:
			target[a] = t
		}
	}
	var out []resolvedAlias
	resolved := map[string]bool{}
	for _, r := range rows {
		a := strings.ToLower(r.Alias)
		t, ok := target[a]
		if !ok || resolved[a] {
			continue
		}
		resolved[a] = true
		what := fmt.Sprintf("alias %q -> %q", r.Alias, r.Target)
		cur, depth := t, 1
		path := []string{a}
		for ; byName[cur] == nil; depth++ {
			next, ok := target[cur]
			path = append(path, cur)
			switch {
			case !ok:
				s.skip(skipAliasDangling, what+": no cluster or alias "+cur)
			case slices.Contains(path, next):
				s.skip(skipAliasLoop, what)
			case depth >= maxChain:
				s.skip(skipAliasTooDeep, fmt.Sprintf("%s: more than %d aliases to a cluster", what, maxChain))
			default:
				cur = next
				continue
			}
			break
		}
		c := byName[cur]
		if c == nil {
			continue
		}
		if zoneLen+c.longest()+len(a)+1 > maxNameLen {
			s.skip(skipNameTooLong, what+": its names would be longer than 255 octets")
			continue
		}
		out = append(out, resolvedAlias{alias: a, target: t, final: cur, depth: depth})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].depth < out[j].depth })
	return out
}

func (s *snapshot) skip(reason, what string) {
	s.skipped = append(s.skipped, skipped{reason: reason, what: what})
}
