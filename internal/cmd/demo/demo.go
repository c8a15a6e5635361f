package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// zone is the zone the demo serves.
const zone = "pgcluster.lan"

// node is one row of the demo registry.
type node struct {
	cluster, name, address, role string
	port                         int
	zone                         string // its topology zone, in region demoRegion
}

// demoNodes and demoAliases are the demo registry: cluster local with one
// primary and two standbys, and prod → local, myapp-db → prod. Each node
// has an address of its own, so that answers tell them apart; its port is
// its server's, a free one (see startNodes).
var (
	demoNodes = []node{
		{"local", "pg1", "127.0.0.11", "primary", 0, "a"},
		{"local", "pg2", "127.0.0.12", "standby", 0, "b"},
		{"local", "pg3", "127.0.0.13", "standby", 0, "b"},
	}
	demoAliases = [][2]string{{"prod", "local"}, {"myapp-db", "prod"}}
	// demoNetworks place the demo's clients (topology prefer): a client
	// in 10.1.0.0/16 is in zone a, one in 10.2.0.0/16 in zone b; the
	// instructions ask for each with dig +subnet.
	demoNetworks = [][2]string{{"10.1.0.0/16", "a"}, {"10.2.0.0/16", "b"}}
)

// demoRegion is the region of every demo node and network.
const demoRegion = "demo"

// seed applies the registry schema and writes the demo registry, nodes
// as started by startNodes. Running it again resets the demo rows.
func seed(ctx context.Context, dsn string, nodes []node) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, pgcluster.Schema); err != nil {
		return fmt.Errorf("apply schema: %w", err)
	}
	return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		for _, n := range nodes {
			if _, err := tx.Exec(ctx, `INSERT INTO pgcluster_nodes (cluster, name, address, port, role, region, zone)
VALUES ($1, $2, $3, $4, $5, $6, $7)
ON CONFLICT (cluster, name) DO UPDATE
SET address = EXCLUDED.address, port = EXCLUDED.port, role = EXCLUDED.role, healthy = true, heartbeat = now(),
  region = EXCLUDED.region, zone = EXCLUDED.zone`,
				n.cluster, n.name, n.address, n.port, n.role, demoRegion, n.zone); err != nil {
				return fmt.Errorf("insert node %s: %w", n.name, err)
			}
		}
		for _, nw := range demoNetworks {
			if _, err := tx.Exec(ctx, `INSERT INTO pgcluster_networks (network, region, zone) VALUES ($1, $2, $3)
ON CONFLICT (network) DO UPDATE SET region = EXCLUDED.region, zone = EXCLUDED.zone`, nw[0], demoRegion, nw[1]); err != nil {
				return fmt.Errorf("insert network %s: %w", nw[0], err)
			}
		}
		for _, a := range demoAliases {
			if _, err := tx.Exec(ctx, `INSERT INTO pgcluster_aliases (alias, target) VALUES ($1, $2)
ON CONFLICT (alias) DO UPDATE SET target = EXCLUDED.target`, a[0], a[1]); err != nil {
				return fmt.Errorf("insert alias %s: %w", a[0], err)
			}
		}
		return nil
	})
}

// startNodes starts a real PostgreSQL server for each demo node, listening
// on the node's own loopback address, so that clients (pgdiscover, psql)
// reach them through the zone: the first node a primary, the others its
// streaming standbys (pg_basebackup -R), so that check postgres reads real
// roles. The standbys, each a copy of the primary, are made and started at
// once. Each takes a free port on its address, as everything else the
// demo starts does: a fixed one (5432) would be another demo's, or a local
// PostgreSQL's, and this demo's fleet would check their servers as its
// own. It returns the nodes with their ports, in demoNodes' order, and the
// servers by node name; on error it has stopped those it started, and the
// error names each node whose server did not start.
func startNodes() ([]node, map[string]*pgtest.Postgres, error) {
	servers := make([]*pgtest.Postgres, len(demoNodes))
	errs := make([]error, len(demoNodes))
	startNode := func(i int, primary *pgtest.Postgres) {
		n := demoNodes[i]
		opts := pgtest.Options{Host: n.address}
		var err error
		if primary == nil {
			// Two base backups at once: each one's checkpoint may
			// recycle the WAL segment the other's stream starts
			// from ("requested WAL segment … has already been
			// removed") unless the primary keeps some.
			opts.Settings = map[string]string{"wal_keep_size": "128MB"}
			servers[i], err = pgtest.Start(opts)
		} else {
			servers[i], err = pgtest.StartStandby(primary, opts)
		}
		if err != nil {
			errs[i] = fmt.Errorf("start the server of node %s on %s: %v", n.name, n.address, firstLine(err))
		}
	}
	startNode(0, nil)
	if errs[0] == nil {
		var wg sync.WaitGroup
		for i := 1; i < len(demoNodes); i++ {
			wg.Go(func() { startNode(i, servers[0]) })
		}
		wg.Wait()
	}
	if err := errors.Join(errs...); err != nil {
		for _, pg := range servers {
			if pg != nil {
				pg.Close()
			}
		}
		return nil, nil, err
	}
	var nodes []node
	started := map[string]*pgtest.Postgres{}
	for i, n := range demoNodes {
		n.port = servers[i].Port
		nodes = append(nodes, n)
		started[n.name] = servers[i]
	}
	return nodes, started, nil
}

func firstLine(err error) string {
	s, _, _ := strings.Cut(err.Error(), "\n")
	return s
}

// corefileConfig is what the demo Corefile varies on: the ports of an
// instance, and what every instance shares.
type corefileConfig struct {
	port    int    // DNS port on 127.0.0.1; 0 picks a free one
	ready   string // address of the ready plugin
	metrics string // address of the prometheus plugin
	dsn     string // the registry
	redis   string // URL of the Redis the fleet shares its checks through
}

// corefile returns the Corefile of an instance of the demo fleet. It has no
// log plugin: the transitions (a node in or out, Redis lost and back) are
// what the demo's output is for.
func corefile(c corefileConfig) string {
	return fmt.Sprintf(`%s:%d {
    bind 127.0.0.1
    errors
    ready %s
    prometheus %s
    pgcluster {
        postgres %s
        allow_loopback
        ttl 5
        check postgres "user=postgres dbname=postgres sslmode=disable"
        interval 1s
        timeout 500ms
        topology prefer
        redis %s
    }
}
`, zone, c.port, c.ready, c.metrics, c.dsn, c.redis)
}

// checkFree fails when addr is taken for TCP or, when udp is set, for UDP.
func checkFree(addr string, udp bool) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	l.Close()
	if udp {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return err
		}
		pc.Close()
	}
	return nil
}

// probe asks server for the A records of prod.Z and returns the answer when
// it holds the alias's CNAME and at least one address.
func probe(server string) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn("prod."+zone), dns.TypeA)
	c := &dns.Client{Timeout: 500 * time.Millisecond}
	r, _, err := c.Exchange(m, server)
	if err != nil {
		return nil, err
	}
	if r.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("prod.%s: %s", zone, dns.RcodeToString[r.Rcode])
	}
	var cname, a bool
	for _, rr := range r.Answer {
		switch rr.(type) {
		case *dns.CNAME:
			cname = true
		case *dns.A:
			a = true
		}
	}
	if !cname || !a {
		return nil, fmt.Errorf("prod.%s: no CNAME and addresses yet: %v", zone, r.Answer)
	}
	return r, nil
}

// summary renders an answer as "CNAME local.pgcluster.lan.; A 127.0.0.11 …".
func summary(r *dns.Msg) string {
	var cnames, addrs []string
	for _, rr := range r.Answer {
		switch rr := rr.(type) {
		case *dns.CNAME:
			cnames = append(cnames, rr.Target)
		case *dns.A:
			addrs = append(addrs, rr.A.String())
		}
	}
	return "CNAME " + strings.Join(cnames, " ") + "; A " + strings.Join(addrs, " ")
}
