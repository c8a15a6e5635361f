package pgcluster

import (
	"context"
	"maps"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// changes is what the notifications received since the last read say
// changed: clusters and aliases, the networks (read whole: a client's place
// depends on every network around it), or everything (full).
type changes struct {
	full     bool
	clusters map[string]bool
	aliases  map[string]bool
	networks bool
}

// add reads one notification's payload: "nodes:<cluster>",
// "aliases:<alias>" and "networks:<network>" name what changed; anything
// else (the table names that schema.sql sends when much changed or a table
// was truncated, and that earlier versions sent for every change) asks for
// a full reload.
func (c *changes) add(payload string) {
	if c.clusters == nil {
		c.clusters, c.aliases = map[string]bool{}, map[string]bool{}
	}
	if cl, ok := strings.CutPrefix(payload, "nodes:"); ok {
		c.clusters[cl] = true
	} else if a, ok := strings.CutPrefix(payload, "aliases:"); ok {
		c.aliases[a] = true
	} else if strings.HasPrefix(payload, "networks:") {
		c.networks = true
	} else {
		c.full = true
	}
}

func (c *changes) any() bool {
	return c.full || len(c.clusters) > 0 || len(c.aliases) > 0 || c.networks
}

// covers reports whether a read of what c names reads everything o names.
func (c *changes) covers(o *changes) bool {
	if c.full {
		return true
	}
	if o.full || o.networks && !c.networks {
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
	c.networks = c.networks || o.networks
	maps.Copy(c.clusters, o.clusters)
	maps.Copy(c.aliases, o.aliases)
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

// registryShape is what of the registry's tables this version reads that
// an older schema.sql did not make, or the DSN's role may not read: a
// registry without them is followed as before, its nodes without a place
// and its clients in none, until schema.sql is applied and SELECT granted.
type registryShape struct {
	places   bool // pgcluster_nodes has region and zone
	networks bool // pgcluster_networks exists, and may be read
	drains   bool // pgcluster_drains exists, and may be read
	// failover: pgcluster_aliases has the fail-over columns and
	// pgcluster_alias_state exists, both readable.
	failover bool
}

// fullShape is a registry that has everything this version reads.
var fullShape = registryShape{places: true, networks: true, drains: true, failover: true}

// shapeQuery finds the registryShape; it cannot fail on a registry that
// lacks them.
const shapeQuery = `SELECT
  (SELECT count(*) = 2 FROM pg_attribute
    WHERE attrelid = to_regclass('pgcluster_nodes') AND attname IN ('region', 'zone') AND NOT attisdropped)
  AND coalesce(has_column_privilege(to_regclass('pgcluster_nodes'), 'region', 'SELECT')
    AND has_column_privilege(to_regclass('pgcluster_nodes'), 'zone', 'SELECT'), false),
  coalesce(has_table_privilege(to_regclass('pgcluster_networks'), 'SELECT'), false),
  coalesce(has_table_privilege(to_regclass('pgcluster_drains'), 'SELECT'), false),
  EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('pgcluster_aliases') AND attname = 'failback' AND NOT attisdropped)
  AND coalesce(has_table_privilege(to_regclass('pgcluster_alias_state'), 'SELECT'), false)`

// readShape reads the registry's shape.
func readShape(ctx context.Context, conn *pgx.Conn) (registryShape, error) {
	var sh registryShape
	err := conn.QueryRow(ctx, shapeQuery).Scan(&sh.places, &sh.networks, &sh.drains, &sh.failover)
	return sh, err
}

// shapeWarning says what an incomplete shape leaves out, and what to do.
func shapeWarning(sh registryShape, user string) string {
	switch {
	case !sh.places:
		return "Registry has no region and zone columns in pgcluster_nodes that this role may read: nodes are served without a place (topology prefer and local order nothing); apply this version's schema.sql"
	case !sh.networks:
		return "Registry has no pgcluster_networks table that this role may read: no client is placed (topology prefer and local answer as off); apply this version's schema.sql and GRANT SELECT ON pgcluster_networks TO " + user
	case !sh.failover:
		return "Registry has no pgcluster_alias_state table, or fail-over columns in pgcluster_aliases, that this role may read: no alias fails over; apply this version's schema.sql and GRANT SELECT, INSERT, UPDATE ON pgcluster_alias_state TO " + user
	case !sh.drains:
		return "Registry has no pgcluster_drains table that this role may read: no node is drained (pgclusterctl drain has no effect); apply this version's schema.sql and GRANT SELECT ON pgcluster_drains TO " + user
	}
	return ""
}
