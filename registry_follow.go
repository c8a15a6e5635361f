package pgcluster

import (
	"context"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// changes is what the notifications received since the last read say
// changed: clusters and aliases, or everything (full).
type changes struct {
	full     bool
	clusters map[string]bool
	aliases  map[string]bool
}

// add reads one notification's payload: "nodes:<cluster>" and
// "aliases:<alias>" name what changed; anything else (the table names that
// schema.sql sends when much changed or a table was truncated, and that
// earlier versions sent for every change) asks for a full reload.
func (c *changes) add(payload string) {
	if c.clusters == nil {
		c.clusters, c.aliases = map[string]bool{}, map[string]bool{}
	}
	if cl, ok := strings.CutPrefix(payload, "nodes:"); ok {
		c.clusters[cl] = true
	} else if a, ok := strings.CutPrefix(payload, "aliases:"); ok {
		c.aliases[a] = true
	} else {
		c.full = true
	}
}

func (c *changes) any() bool { return c.full || len(c.clusters) > 0 || len(c.aliases) > 0 }

// covers reports whether a read of what c names reads everything o names.
func (c *changes) covers(o *changes) bool {
	if c.full {
		return true
	}
	if o.full {
		return false
	}
	for cl := range o.clusters {
		if !c.clusters[cl] {
			return false
		}
	}
	for a := range o.aliases {
		if !c.aliases[a] {
			return false
		}
	}
	return true
}

// merge adds what o names to c.
func (c *changes) merge(o *changes) {
	if c.clusters == nil {
		c.clusters, c.aliases = map[string]bool{}, map[string]bool{}
	}
	c.full = c.full || o.full
	maps.Copy(c.clusters, o.clusters)
	maps.Copy(c.aliases, o.aliases)
}

// rowSet is the registry as followed: each served cluster's nodes (every
// row whose cluster is that name in lower case) with the time their
// heartbeat ages were measured, and the aliases. Its maps are replaced,
// never changed, once handed out (lastLoads keeps them).
type rowSet struct {
	clusters map[string]clusterRows
	aliases  map[string]Alias // by alias as stored
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

func (rs *rowSet) aliasList() []Alias {
	out := make([]Alias, 0, len(rs.aliases))
	for _, a := range slices.Sorted(maps.Keys(rs.aliases)) {
		out = append(out, rs.aliases[a])
	}
	return out
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

// full replaces everything with a full read made at "at".
func (rs *rowSet) full(nodes []Node, aliases []Alias, at time.Time) {
	rs.clusters = map[string]clusterRows{}
	rs.aliases = map[string]Alias{}
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
// returns the served clusters that changed.
func (rs *rowSet) replace(clusters, aliases map[string]bool, nodes []Node, as []Alias, at time.Time) map[string]bool {
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

// agesQuery reads only what stale_after needs.
const agesQuery = `SELECT cluster || '/' || name AS key, ` + heartbeatAgeColumn + `
FROM pgcluster_nodes`

// readAges reads every node's heartbeat age.
func readAges(ctx context.Context, conn *pgx.Conn) (map[string]time.Duration, error) {
	rows, err := conn.Query(ctx, agesQuery)
	if err != nil {
		return nil, err
	}
	ages := map[string]time.Duration{}
	var key string
	var age float64
	_, err = pgx.ForEachRow(rows, []any{&key, &age}, func() error {
		ages[key] = heartbeatAge(age)
		return nil
	})
	return ages, err
}
