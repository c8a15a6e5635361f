package test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/discovery"
)

// TestDiscoveryPrefersNearZone: discovery through bin/coredns with
// topology prefer, from a client (source 127.0.0.1) in zone b's network.
// The SRV answer gives zone b's nodes priority 0 and zone a's 10; the
// client probes zone b's first when it may probe only as many as zone b
// has (MaxProbes 2 of 4), and chooses a zone b node even when zone a's
// answer faster: the lowest reachable priority first (RFC 2782). With zone
// b's nodes down it chooses zone a's.
func TestDiscoveryPrefersNearZone(t *testing.T) {
	type node struct{ name, zone, addr string }
	nodes := []node{{"a1", "a", "127.0.0.101"}, {"a2", "a", "127.0.0.102"}, {"b1", "b", "127.0.0.103"}, {"b2", "b", "127.0.0.104"}}
	listeners := map[string]net.Listener{}
	var rows []string
	for _, n := range nodes {
		l, err := net.Listen("tcp", n.addr+":0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		listeners[n.name] = l
		rows = append(rows, fmt.Sprintf("('main', '%s', '%s', %d, 'standby', 'eu', '%s')", n.name, n.addr, l.Addr().(*net.TCPAddr).Port, n.zone))
	}
	pg := Registry(t)
	pg.MustExec(t, "INSERT INTO pgcluster_nodes(cluster, name, address, port, role, region, zone) VALUES "+strings.Join(rows, ", ")+
		";\nINSERT INTO pgcluster_networks(network, region, zone) VALUES ('127.0.0.1/32', 'eu', 'b')")
	in := StartFleetInstance(t, fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n pgcluster {\n  postgres %s\n  allow_loopback\n  topology prefer\n }\n}\n",
		Zone, PortPlaceholder, pg.DSN("")))
	c, err := discovery.New(discovery.Config{Servers: []string{in.Addr()}, Prober: discovery.TCPProbe, MaxProbes: 2})
	if err != nil {
		t.Fatal(err)
	}
	zoneOf := func(a netip.AddrPort) string {
		for _, n := range nodes {
			if n.addr == a.Addr().String() {
				return n.zone
			}
		}
		return "?"
	}
	for i := range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res, err := c.Discover(ctx, "main."+Zone)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		best, _ := res.Best()
		if zoneOf(best.Addr) != "b" || best.Priority != 0 || res.NotProbed != 2 {
			t.Fatalf("discovery %d: best %v (priority %d, zone %s), %d not probed; ranking %v", i, best, best.Priority, zoneOf(best.Addr), res.NotProbed, res.Ranking)
		}
		for _, p := range res.Ranking {
			if zoneOf(p.Addr) != "b" {
				t.Fatalf("discovery %d probed %v of zone a while zone b's two could be probed", i, p)
			}
		}
	}
	// Every node probed, zone b's 20 ms slower: still zone b's.
	slowB := discovery.ProbeFunc(func(ctx context.Context, a netip.AddrPort) (time.Duration, error) {
		d, err := discovery.TCPProbe.Probe(ctx, a)
		if zoneOf(a) == "b" {
			d += 20 * time.Millisecond
		}
		return d, err
	})
	slow, err := discovery.New(discovery.Config{Servers: []string{in.Addr()}, Prober: slowB})
	if err != nil {
		t.Fatal(err)
	}
	res, err := slow.Discover(t.Context(), "main."+Zone)
	if err != nil {
		t.Fatal(err)
	}
	if best, _ := res.Best(); zoneOf(best.Addr) != "b" || len(res.Ranking.Reachable()) != 4 {
		t.Fatalf("zone b slower: best %v, want a zone b node; ranking %v", best, res.Ranking)
	}

	// Zone b's nodes gone: zone a's.
	listeners["b1"].Close()
	listeners["b2"].Close()
	all, err := discovery.New(discovery.Config{Servers: []string{in.Addr()}, Prober: discovery.TCPProbe})
	if err != nil {
		t.Fatal(err)
	}
	res, err = all.Discover(t.Context(), "main."+Zone)
	if err != nil {
		t.Fatal(err)
	}
	if best, _ := res.Best(); zoneOf(best.Addr) != "a" || best.Priority != 10 {
		t.Fatalf("zone b down: best %v (priority %d), want a zone a node at 10; ranking %v", best, best.Priority, res.Ranking)
	}
}
