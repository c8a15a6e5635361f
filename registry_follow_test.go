package pgcluster

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// follower runs a registry follower on pg and keeps what it applied.
type follower struct {
	mu       sync.Mutex
	clusters map[string][]Node
	aliases  []Alias
	networks []Network
	applies  int
}

// apply keeps the rows each update brings, as the publisher does.
func (f *follower) apply(u rowsUpdate) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if u.full || f.clusters == nil {
		f.clusters = map[string][]Node{}
	}
	for c, ns := range u.nodes {
		if len(ns) == 0 {
			delete(f.clusters, c)
		} else {
			f.clusters[c] = ns
		}
	}
	if u.aliasesSet {
		f.aliases = u.aliases
	}
	if u.networksSet {
		f.networks = u.networks
	}
	f.applies++
}

func (f *follower) state() ([]Node, []Alias, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var nodes []Node
	for _, c := range slices.Sorted(maps.Keys(f.clusters)) {
		nodes = append(nodes, f.clusters[c]...)
	}
	return nodes, f.aliases, f.applies
}

func follow(t *testing.T, pg *pgtest.Postgres, set *settings) *follower {
	t.Helper()
	f := &follower{}
	set.dsn, set.zones = pg.DSN(""), []string{"test."}
	r := newRegistry(set, "", f.apply)
	ctx, cancel := context.WithCancel(context.Background())
	go r.run(ctx)
	t.Cleanup(func() { cancel(); <-r.done })
	select {
	case <-r.loaded:
	case <-time.After(10 * time.Second):
		t.Fatal("the registry did not load within 10s")
	}
	return f
}

// rowText is a node's row as the registry holds it, heartbeat aside.
func rowText(n Node) string {
	return fmt.Sprintf("%s/%s %s %d %s %t", n.Cluster, n.Name, n.Address, n.Port, n.Role, n.Healthy)
}

func rowTexts(ns []Node) []string {
	var out []string
	for _, n := range ns {
		out = append(out, rowText(n))
	}
	slices.Sort(out)
	return out
}

func aliasTexts(as []Alias) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Alias+">"+a.Target)
	}
	slices.Sort(out)
	return out
}

// marker makes a change and waits until the follower has applied it: every
// change made before it has been applied too (notifications come in order).
func marker(t *testing.T, pg *pgtest.Postgres, f *follower, n int) {
	t.Helper()
	name := fmt.Sprintf("zz-marker-%d", n)
	pg.MustExec(t, "INSERT INTO pgcluster_aliases VALUES ($1, 'c0')", name)
	if err := pgtest.WaitFor(10*time.Second, func() error {
		_, as, _ := f.state()
		for _, a := range as {
			if a.Alias == name {
				return nil
			}
		}
		return fmt.Errorf("marker %s not applied", name)
	}); err != nil {
		t.Fatal(err)
	}
}

// A follower that reads only what each notification names ends up with the
// same rows as a full read, over random inserts, updates (a cluster's rows
// moved to another cluster too), deletes, alias changes and truncates, in
// statements of one or many rows and transactions of several statements.
func TestFollowChangesMatchFullRead(t *testing.T) {
	pg := pgtest.New(t)
	pg.MustExec(t, Schema)
	f := follow(t, pg, &settings{refresh: time.Hour})
	rnd := rand.New(rand.NewPCG(8, 9))
	cl := func() string { return fmt.Sprintf("c%d", rnd.IntN(5)) }
	node := func() string { return fmt.Sprintf("n%d", rnd.IntN(6)) }
	addr := func() string { return fmt.Sprintf("192.0.2.%d", 1+rnd.IntN(200)) }
	ops := []func() string{
		func() string {
			return fmt.Sprintf("INSERT INTO pgcluster_nodes(cluster, name, address, role) VALUES ('%s', '%s', '%s', 'standby') ON CONFLICT DO NOTHING", cl(), node(), addr())
		},
		func() string {
			return fmt.Sprintf("UPDATE pgcluster_nodes SET address = '%s' WHERE cluster = '%s' AND name = '%s'", addr(), cl(), node())
		},
		func() string {
			return fmt.Sprintf("UPDATE pgcluster_nodes SET healthy = NOT healthy WHERE cluster = '%s'", cl())
		},
		func() string {
			return fmt.Sprintf("UPDATE pgcluster_nodes SET role = CASE role WHEN 'primary' THEN 'standby' ELSE 'primary' END WHERE name = '%s'", node())
		},
		func() string { return "UPDATE pgcluster_nodes SET heartbeat = now()" },
		func() string {
			return fmt.Sprintf("DELETE FROM pgcluster_nodes WHERE cluster = '%s' AND name = '%s'", cl(), node())
		},
		func() string {
			// Moves a cluster's rows to another, unless a name would collide.
			from, to := cl(), cl()
			return fmt.Sprintf(`UPDATE pgcluster_nodes n SET cluster = '%s' WHERE cluster = '%s'
  AND NOT EXISTS (SELECT 1 FROM pgcluster_nodes m WHERE m.cluster = '%s' AND m.name = n.name)`, to, from, to)
		},
		func() string {
			return fmt.Sprintf("INSERT INTO pgcluster_aliases VALUES ('a%d', '%s') ON CONFLICT (alias) DO UPDATE SET target = EXCLUDED.target", rnd.IntN(4), cl())
		},
		func() string { return fmt.Sprintf("DELETE FROM pgcluster_aliases WHERE alias = 'a%d'", rnd.IntN(4)) },
		func() string {
			if rnd.IntN(8) == 0 {
				return "TRUNCATE pgcluster_nodes"
			}
			return "SELECT 1"
		},
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for round := range 8 {
		for range 40 {
			var stmts []string
			for range 1 + rnd.IntN(3) {
				stmts = append(stmts, ops[rnd.IntN(len(ops))]())
			}
			if _, err := conn.Exec(ctx, "BEGIN; "+strings.Join(stmts, "; ")+"; COMMIT"); err != nil {
				t.Fatalf("%v: %v", stmts, err)
			}
		}
		marker(t, pg, f, round)
		nodes, aliases, _, err := readRegistry(ctx, conn, nil, fullShape)
		if err != nil {
			t.Fatal(err)
		}
		got, gotAliases, _ := f.state()
		if want := rowTexts(nodeList(nodes)); !slices.Equal(rowTexts(got), want) {
			t.Fatalf("round %d: followed rows\n%v\nfull read\n%v", round, rowTexts(got), want)
		}
		if want := aliasTexts(aliasList(aliases)); !slices.Equal(aliasTexts(gotAliases), want) {
			t.Fatalf("round %d: followed aliases %v, full read %v", round, aliasTexts(gotAliases), want)
		}
	}
}

// Heartbeats written, one row or all at once, publish nothing; with
// stale_after, a node whose heartbeat stops leaves when it crosses the
// limit, and comes back within a tick of its next heartbeat.
func TestFollowHeartbeats(t *testing.T) {
	pg := pgtest.New(t)
	pg.MustExec(t, Schema)
	pg.MustExec(t, "INSERT INTO pgcluster_nodes(cluster, name, address) SELECT 'c', 'n' || i, ('192.0.2.' || i)::inet FROM generate_series(1, 50) i")
	f := follow(t, pg, &settings{refresh: time.Hour})
	marker(t, pg, f, 0)
	_, _, before := f.state()
	for range 100 {
		pg.MustExec(t, "UPDATE pgcluster_nodes SET heartbeat = now() WHERE name = 'n7'")
	}
	pg.MustExec(t, "UPDATE pgcluster_nodes SET heartbeat = now()")
	marker(t, pg, f, 1)
	if _, _, after := f.state(); after != before+1 {
		t.Fatalf("101 heartbeat-only updates and a marker made %d applies, want 1 (the marker)", after-before)
	}

	// stale_after 1s: n1 stops writing, the others keep on.
	g := follow(t, pg, &settings{refresh: time.Hour, staleAfter: time.Second})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				pg.Exec(context.Background(), "UPDATE pgcluster_nodes SET heartbeat = now() WHERE name <> 'n1'")
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	age := func(name string) time.Duration {
		ns, _, _ := g.state()
		for _, n := range ns {
			if n.Name == name {
				return n.HeartbeatAge
			}
		}
		return -1
	}
	stopped := time.Now()
	pg.MustExec(t, "UPDATE pgcluster_nodes SET heartbeat = now() WHERE name = 'n1'")
	if err := pgtest.WaitFor(5*time.Second, func() error {
		if a := age("n1"); a <= time.Second {
			return fmt.Errorf("n1's heartbeat age as applied: %v", a)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("n1 applied as stale %v after its last heartbeat (stale_after 1s)", time.Since(stopped).Round(time.Millisecond))
	if a := age("n2"); a > time.Second {
		t.Errorf("n2, which keeps writing heartbeats, applied with age %v", a)
	}
	back := time.Now()
	pg.MustExec(t, "UPDATE pgcluster_nodes SET heartbeat = now() WHERE name = 'n1'")
	if err := pgtest.WaitFor(5*time.Second, func() error {
		if a := age("n1"); a > time.Second {
			return fmt.Errorf("n1's heartbeat age as applied: %v", a)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("n1 applied as fresh %v after its heartbeat came back (tick %v)", time.Since(back).Round(time.Millisecond), min(time.Second/2, time.Second))
}

// However a notification is lost, the zone ends up as a build from a full
// read makes it: a change made with the triggers off is caught by the
// refresh poll; a payload the follower cannot use reads everything; a
// change made while the connection was down is read on reconnect.
func TestFollowLostNotifications(t *testing.T) {
	pg := pgtest.New(t)
	pg.MustExec(t, Schema)
	pg.MustExec(t, `INSERT INTO pgcluster_nodes(cluster, name, address, role)
  SELECT 'c' || (i % 3), 'n' || i, ('192.0.2.' || i)::inet, CASE WHEN i < 3 THEN 'primary' ELSE 'standby' END FROM generate_series(0, 11) i`)
	pg.MustExec(t, "INSERT INTO pgcluster_aliases VALUES ('a0', 'c0'), ('a1', 'a0')")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	start := func(refresh time.Duration) *PgCluster {
		set := &settings{dsn: pg.DSN(""), zones: []string{testZone}, ttl: 5, refresh: refresh}
		p := &PgCluster{Zones: set.zones, ttl: set.ttl}
		pb := newPublisher(set, nil, false)
		p.pb = pb
		r := newRegistry(set, "", pb.applyAt)
		rctx, cancel := context.WithCancel(ctx)
		go r.run(rctx)
		t.Cleanup(func() { cancel(); <-r.done })
		return p
	}
	// matches waits until p serves what a full read of the registry makes.
	matches := func(p *PgCluster, what string) {
		t.Helper()
		var diff string
		if err := pgtest.WaitFor(10*time.Second, func() error {
			nodes, as, _, err := readRegistry(ctx, conn, nil, fullShape)
			if err != nil {
				return err
			}
			s := p.snapshot()
			if s == nil {
				return fmt.Errorf("nothing served yet")
			}
			want := build(buildInput{settings: s.set, nodes: nodeList(nodes), aliases: aliasList(as)})
			want.setSerial(s.serial, s.set.ttl)
			if diff = diffLines(dump(s), dump(want)); diff != "" {
				return fmt.Errorf("differs")
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: the zone is not what a full read makes:\n%s", what, diff)
		}
	}
	// silently makes a change that notifies nothing.
	silently := func(stmt string) {
		t.Helper()
		pg.MustExec(t, `BEGIN; ALTER TABLE pgcluster_nodes DISABLE TRIGGER USER; ALTER TABLE pgcluster_aliases DISABLE TRIGGER USER; `+stmt+
			`; ALTER TABLE pgcluster_nodes ENABLE TRIGGER USER; ALTER TABLE pgcluster_aliases ENABLE TRIGGER USER; COMMIT`)
	}

	p := start(time.Hour)
	matches(p, "first load")
	pg.MustExec(t, "UPDATE pgcluster_nodes SET healthy = false WHERE name = 'n4'")
	matches(p, "a change notified")

	// A payload the follower cannot use: it reads everything.
	silently("UPDATE pgcluster_nodes SET role = 'standby' WHERE name = 'n0'; UPDATE pgcluster_aliases SET target = 'c1' WHERE alias = 'a0'")
	pg.MustExec(t, "NOTIFY "+Channel+", 'from another version'")
	matches(p, "an unknown payload")

	// A change made while the connection is down: read on reconnect.
	silently("DELETE FROM pgcluster_nodes WHERE cluster = 'c2'; INSERT INTO pgcluster_nodes(cluster, name, address, role) VALUES ('c3', 'x', '192.0.2.99', 'primary')")
	pg.MustExec(t, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'coredns-pgcluster'")
	matches(p, "a reconnect")

	// A change nobody is told of at all: the refresh poll reads it.
	q := start(time.Second)
	matches(q, "second follower's first load")
	silently("UPDATE pgcluster_nodes SET address = '192.0.2.200' WHERE name = 'n1'; DELETE FROM pgcluster_aliases WHERE alias = 'a1'")
	matches(q, "the refresh poll")
}
