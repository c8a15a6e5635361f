package test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// dbNode is a real PostgreSQL server standing for one node of a cluster.
type dbNode struct {
	name string
	pg   *pgtest.Postgres
}

// addr is the node's address as the discovery package prints it.
func (n dbNode) addr() string { return fmt.Sprintf("127.0.0.1:%d", n.pg.Port) }

// startNodes starts PostgreSQL servers n1..nN in parallel (each start is
// mostly waiting on pg_ctl) and stops them when the test ends.
func startNodes(t *testing.T, n int) []dbNode {
	t.Helper()
	nodes := make([]dbNode, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			pg, err := pgtest.Start(pgtest.Options{})
			nodes[i], errs[i] = dbNode{name: fmt.Sprintf("n%d", i+1), pg: pg}, err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err == nil {
			t.Cleanup(nodes[i].pg.Close)
		}
	}
	for _, err := range errs {
		if err != nil {
			t.Fatalf("this test needs real PostgreSQL servers and could not start one: %v", err)
		}
	}
	return nodes
}

// register inserts nodes into cluster "local" of the registry, the first
// as the primary, the others as standbys, all at 127.0.0.1 on their own
// port, and makes "prod" an alias of "local".
func register(t *testing.T, reg *pgtest.Postgres, nodes ...dbNode) {
	t.Helper()
	var rows []string
	for i, n := range nodes {
		role := "standby"
		if i == 0 {
			role = "primary"
		}
		rows = append(rows, fmt.Sprintf("('local', '%s', '127.0.0.1', %d, '%s')", n.name, n.pg.Port, role))
	}
	reg.MustExec(t, "INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES "+
		strings.Join(rows, ", ")+"; INSERT INTO pgcluster_aliases(alias, target) VALUES ('prod', 'local')")
}

// stableCorefile serves Zone from the registry at dsn on a fixed port, so
// that a restarted server is found where the clients look, with loopback
// addresses allowed and a TTL of 1 s.
func stableCorefile(dsn string, port int) string {
	return fmt.Sprintf("%s:%d {\n  bind 127.0.0.1\n  pgcluster {\n    postgres %s\n    allow_loopback\n    ttl 1\n  }\n}\n",
		Zone, port, dsn)
}
