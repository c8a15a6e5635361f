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

// rowSet is the registry as followed: each cluster's nodes with the time
// their heartbeat ages were measured, and the aliases.
type rowSet struct {
	clusters map[string]clusterRows
	aliases  map[string]Alias
}

type clusterRows struct {
	nodes []Node
	at    time.Time // when the nodes' HeartbeatAge were measured
}

// nodesAt returns every node with its heartbeat age as of now, in cluster
// order. Ages that stand for infinite heartbeats stay as they are.
func (rs *rowSet) nodesAt(now time.Time) []Node {
	var out []Node
	for _, name := range slices.Sorted(maps.Keys(rs.clusters)) {
		c := rs.clusters[name]
		d := now.Sub(c.at)
		for _, n := range c.nodes {
			if n.HeartbeatAge != math.MaxInt64 && n.HeartbeatAge != math.MinInt64 {
				n.HeartbeatAge = satAdd(n.HeartbeatAge, d)
			}
			out = append(out, n)
		}
	}
	return out
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
	rs.replace(nil, nil, nodes, aliases, at)
}

// replace puts the rows read of the clusters and aliases named in place of
// the ones held (absent from the read: deleted).
func (rs *rowSet) replace(clusters, aliases map[string]bool, nodes []Node, as []Alias, at time.Time) {
	for c := range clusters {
		delete(rs.clusters, c)
	}
	for a := range aliases {
		delete(rs.aliases, a)
	}
	for _, n := range nodes {
		c := rs.clusters[n.Cluster]
		c.nodes, c.at = append(c.nodes, n), at
		rs.clusters[n.Cluster] = c
	}
	for _, a := range as {
		rs.aliases[a.Alias] = a
	}
}

// setAges replaces every node's heartbeat age with one read at "at", by
// "cluster/name"; nodes the read does not have keep theirs (they left
// meanwhile, and a notification says so).
func (rs *rowSet) setAges(ages map[string]time.Duration, at time.Time) {
	for name, c := range rs.clusters {
		d := at.Sub(c.at)
		nodes := slices.Clone(c.nodes)
		for i, n := range nodes {
			if a, ok := ages[n.Cluster+"/"+n.Name]; ok {
				nodes[i].HeartbeatAge = a
			} else if n.HeartbeatAge != math.MaxInt64 && n.HeartbeatAge != math.MinInt64 {
				nodes[i].HeartbeatAge = satAdd(n.HeartbeatAge, d)
			}
		}
		rs.clusters[name] = clusterRows{nodes: nodes, at: at}
	}
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
