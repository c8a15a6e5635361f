package pgcluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// moveProd is one registry transaction that moves alias prod from cluster
// t<i-1> to t<i>: it inserts t<i>'s two nodes, points prod at t<i> and
// deletes t<i-1>'s nodes. The statements come in one of three orders, so
// that the transaction's first notification names each of its changes in
// turn: read on its own, the alias moved to a cluster without nodes, or
// the old cluster deleted under the alias, is an answer of NXDOMAIN.
func moveProd(i int) string {
	ins := fmt.Sprintf("INSERT INTO pgcluster_nodes(cluster, name, address) VALUES ('t%d', 'a', '%s'), ('t%d', 'b', '%s')",
		i, prodAddrs(i)[0], i, prodAddrs(i)[1])
	mv := fmt.Sprintf("UPDATE pgcluster_aliases SET target = 't%d' WHERE alias = 'prod'", i)
	del := fmt.Sprintf("DELETE FROM pgcluster_nodes WHERE cluster = 't%d'", i-1)
	orders := [][]string{{mv, ins, del}, {del, mv, ins}, {ins, del, mv}}
	return "BEGIN; " + strings.Join(orders[i%len(orders)], "; ") + "; COMMIT"
}

// prodAddrs are the addresses of cluster t<i>'s nodes.
func prodAddrs(i int) []string {
	x := 2 * (i % 120)
	return []string{fmt.Sprintf("198.51.100.%d", x+1), fmt.Sprintf("198.51.100.%d", x+2)}
}

// prodState says what the follower's rows answer for prod: "t<i>" when
// they hold the whole of one transaction (prod points at t<i>, the only
// cluster t<...>, with its two nodes), else what is half.
func prodState(clusters map[string][]Node, aliases []Alias) (string, error) {
	target := ""
	for _, a := range aliases {
		if a.Alias == "prod" {
			target = a.Target
		}
	}
	var held []string
	for c := range clusters {
		if strings.HasPrefix(c, "t") {
			held = append(held, c)
		}
	}
	slices.Sort(held)
	if target == "" || len(held) != 1 || held[0] != target || len(clusters[target]) != 2 {
		return "", fmt.Errorf("prod -> %q with clusters %v (%d nodes in the target)", target, held, len(clusters[target]))
	}
	return target, nil
}

// A registry transaction is one change: one that moves an alias to a new
// cluster, inserts that cluster's nodes and drops the old one's is applied
// whole by the follower, 100 times over, whatever the order of its
// statements; no update applied shows part of it.
func TestFollowTransactionWhole(t *testing.T) {
	pg := pgtest.New(t)
	pg.MustExec(t, Schema)
	pg.MustExec(t, fmt.Sprintf(`INSERT INTO pgcluster_nodes(cluster, name, address) VALUES ('t0', 'a', '%s'), ('t0', 'b', '%s');
INSERT INTO pgcluster_aliases VALUES ('prod', 't0')`, prodAddrs(0)[0], prodAddrs(0)[1]))

	f := &follower{}
	var mu sync.Mutex
	var half []string
	applied := 0
	check := func(u rowsUpdate) {
		f.apply(u)
		f.mu.Lock()
		_, err := prodState(f.clusters, f.aliases)
		f.mu.Unlock()
		mu.Lock()
		defer mu.Unlock()
		applied++
		if err != nil {
			half = append(half, fmt.Sprintf("update %d: %v", applied, err))
		}
	}
	set := &settings{refresh: time.Hour, dsn: pg.DSN(""), zones: []string{testZone}}
	r := newRegistry(set, "", check)
	ctx, cancel := context.WithCancel(context.Background())
	go r.run(ctx)
	t.Cleanup(func() { cancel(); <-r.done })
	select {
	case <-r.loaded:
	case <-time.After(10 * time.Second):
		t.Fatal("the registry did not load within 10s")
	}

	conn, err := pgx.Connect(ctx, pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const transactions = 100
	var took []time.Duration
	for i := 1; i <= transactions; i++ {
		if _, err := conn.Exec(ctx, moveProd(i)); err != nil {
			t.Fatal(err)
		}
		committed := time.Now()
		want := fmt.Sprintf("t%d", i)
		deadline := committed.Add(10 * time.Second)
		for {
			f.mu.Lock()
			got, err := prodState(f.clusters, f.aliases)
			f.mu.Unlock()
			if got == want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("transaction %d not applied after 10s: %v", i, err)
			}
			time.Sleep(100 * time.Microsecond)
		}
		took = append(took, time.Since(committed))
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(took)
	t.Logf("%d transactions, %d updates applied, %d of them showing part of a transaction; COMMIT -> applied p50 %v, max %v",
		transactions, applied, len(half), took[len(took)/2], took[len(took)-1])
	if len(half) > 0 {
		t.Errorf("updates that show part of a transaction (first %d): %v", min(len(half), 5), half[:min(len(half), 5)])
	}
}
