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
