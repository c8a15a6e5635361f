package discovery_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/netip"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcluster/pgcluster/discovery"
	"github.com/pgcluster/pgcluster/discovery/discoverytest"
)

// exampleCluster starts, in this process, a DNS server for pgcluster.lan
// publishing cluster "local" (alias "prod") with two stand-in PostgreSQL
// nodes, n1 up and n2 down, and returns the server's address.
func exampleCluster(scope *discoverytest.Scope) (*discoverytest.Server, []discoverytest.Node) {
	up := discoverytest.NewPostgres(scope)
	down := discoverytest.NewPostgres(scope)
	down.Close()
	nodes := []discoverytest.Node{
		{Name: "n1", Addr: up.Addr, Role: "primary"},
		{Name: "n2", Addr: down.Addr, Role: "standby"},
	}
	dns := discoverytest.NewServer(scope, "pgcluster.lan")
	dns.SetCluster("local", nodes...)
	dns.SetAlias("prod", "local")
	return dns, nodes
}

func ExampleClient_Discover() {
	var scope discoverytest.Scope
	defer scope.Close()
	dns, _ := exampleCluster(&scope)

	c, err := discovery.New(discovery.Config{Servers: []string{dns.Addr}})
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.Discover(context.Background(), "prod.pgcluster.lan")
	if err != nil {
		log.Fatal(err)
	}
	best, _ := res.Best()
	fmt.Println("via", res.Canonical, "ports from SRV:", res.SRV)
	fmt.Println("fastest:", best.Host)
	for _, p := range res.Ranking {
		fmt.Println(p.Host, "reachable:", p.Reachable())
	}
	// Output:
	// via local.pgcluster.lan. ports from SRV: true
	// fastest: n1.local.pgcluster.lan.
	// n1.local.pgcluster.lan. reachable: true
	// n2.local.pgcluster.lan. reachable: false
}

func ExampleClient_Resolve() {
	var scope discoverytest.Scope
	defer scope.Close()
	dns, _ := exampleCluster(&scope)

	c, err := discovery.New(discovery.Config{Servers: []string{dns.Addr}})
	if err != nil {
		log.Fatal(err)
	}
	ans, err := c.Resolve(context.Background(), "primary.prod.pgcluster.lan")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(ans.Name, "->", ans.Canonical, "TTL", ans.TTL)
	for _, cand := range ans.Candidates {
		fmt.Println(cand.Host)
	}
	// Output:
	// primary.prod.pgcluster.lan. -> primary.local.pgcluster.lan. TTL 30s
	// n1.local.pgcluster.lan.
}

func ExampleClient_Watch() {
	var scope discoverytest.Scope
	defer scope.Close()
	dns, nodes := exampleCluster(&scope)

	c, err := discovery.New(discovery.Config{Servers: []string{dns.Addr}})
	if err != nil {
		log.Fatal(err)
	}
	events := make(chan discovery.Event, 16)
	w, err := c.Watch(context.Background(), "prod.pgcluster.lan", discovery.WatchOptions{
		OnEvent: func(e discovery.Event) { events <- e },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close()

	show := func(n int) {
		for range n {
			e := <-events
			fmt.Println(e.Kind, e.Candidate.Host, "primary:", e.Primary, "reason:", e.Reason)
		}
	}
	show(3) // the first answer: two nodes and the primary

	// n2 leaves the cluster; a client that hit a connection error says so.
	dns.SetCluster("local", nodes[0])
	w.ReportError(errors.New("connection refused"))
	show(1)
	// Output:
	// + n1.local.pgcluster.lan. primary: false reason: initial
	// + n2.local.pgcluster.lan. primary: false reason: initial
	// + n1.local.pgcluster.lan. primary: true reason: initial
	// - n2.local.pgcluster.lan. primary: false reason: error
}

func ExampleRank() {
	latency := map[string]time.Duration{"127.0.0.1:5432": 15 * time.Millisecond, "127.0.0.2:5432": 2 * time.Millisecond}
	probe := discovery.ProbeFunc(func(_ context.Context, a netip.AddrPort) (time.Duration, error) {
		if d, ok := latency[a.String()]; ok {
			return d, nil
		}
		return 0, errors.New("connection refused")
	})
	var cands []discovery.Candidate
	for _, a := range []string{"127.0.0.1:5432", "127.0.0.3:5432", "127.0.0.2:5432"} {
		cands = append(cands, discovery.Candidate{Addr: netip.MustParseAddrPort(a)})
	}
	for _, p := range discovery.Rank(context.Background(), probe, time.Second, cands) {
		fmt.Println(p)
	}
	// Output:
	// 127.0.0.2:5432 2ms
	// 127.0.0.1:5432 15ms
	// 127.0.0.3:5432 unreachable (connection refused)
}

func ExampleParseServer() {
	for _, s := range []string{"10.0.0.53", "10.0.0.53:5353", "fd00::53"} {
		addr, _ := discovery.ParseServer(s)
		fmt.Println(addr)
	}
	// Output:
	// 10.0.0.53:53
	// 10.0.0.53:5353
	// [fd00::53]:53
}

// Connect to the fastest node of prod with pgx, through the cluster's DNS.
func ExampleClient_Connect() {
	c, err := discovery.New(discovery.Config{Servers: []string{"10.0.0.53", "10.0.0.54"}})
	if err != nil {
		log.Fatal(err)
	}
	conn, err := c.Connect(context.Background(), "postgres://app@prod.pgcluster.lan/db")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(context.Background())
}

// A pool for writes: it follows primary.prod, so after a failover the
// connections to the old primary are closed and new ones reach the new one.
func ExampleClient_NewPool() {
	c, err := discovery.New(discovery.Config{Servers: []string{"10.0.0.53", "10.0.0.54"}})
	if err != nil {
		log.Fatal(err)
	}
	pool, err := c.NewPool(context.Background(), "postgres://app@primary.prod.pgcluster.lan/db", discovery.WatchOptions{
		OnEvent: func(e discovery.Event) { log.Printf("primary.prod: %s (%s)", e, e.Reason) },
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(context.Background(), "INSERT INTO t VALUES (1)"); err != nil {
		log.Print(err)
	}
}

// An existing pgxpool.Config, with its own hooks, wired to the cluster.
func ExampleClient_NewPoolWithConfig() {
	c, err := discovery.New(discovery.Config{}) // the nameservers of /etc/resolv.conf
	if err != nil {
		log.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig("postgres://app@standby.prod.pgcluster.lan/db?pool_max_conns=20")
	if err != nil {
		log.Fatal(err)
	}
	cfg.MaxConnIdleTime = time.Minute
	pool, err := c.NewPoolWithConfig(context.Background(), cfg, discovery.WatchOptions{Interval: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
}
