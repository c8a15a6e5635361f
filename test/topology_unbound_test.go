package test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/miekg/dns"
)

// unboundNetworks place the clients of TestTopologyThroughUnbound, all on
// loopback source addresses: 127.0.0.0/16 in zone a, but 127.0.2.0/24, a
// network inside it, in zone b.
const unboundNetworks = `
INSERT INTO pgcluster_networks(network, region, zone) VALUES ('127.0.0.0/16', 'eu', 'a'), ('127.0.2.0/24', 'eu', 'b');`

// TestTopologyThroughUnbound puts a real recursive resolver, unbound with
// its subnet cache (module-config "subnetcache iterator", ECS sent for the
// zone), between clients and bin/coredns with topology local. Clients in
// two /24s behind the one resolver, 127.0.1.0/24 (zone a) and 127.0.2.0/24
// (zone b), get their own zone's nodes, each answer cached for its own
// scope (asked again, the instance sees no query); a client in a third
// /24, 127.0.3.0/24, in zone a's network but outside the scope of the
// first client's cached answer (the /23 around it holds zone b's network),
// is answered by the instance, never from another place's cache.
func TestTopologyThroughUnbound(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, topologyRegistry)
	pg.MustExec(t, "DELETE FROM pgcluster_networks;"+unboundNetworks)
	in := StartFleetInstance(t, fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n prometheus 127.0.0.1:%s\n pgcluster {\n  postgres %s\n  topology local\n  ttl 300\n }\n}\n",
		Zone, PortPlaceholder, MetricsPlaceholder, pg.DSN("")))
	resolver := runUnbound(t, in.Addr(), `  module-config: "subnetcache iterator"
  client-subnet-zone: "`+Zone+`"
  max-client-subnet-ipv4: 24`, func(addr string) error {
		_, err := ecsQuery(addr, Zone, dns.TypeSOA, "", "127.0.0.1")
		return err
	})

	ecsQueries := func() float64 {
		return metric(t, in, `coredns_pgcluster_ecs_queries_total{result="answered",zone="`+Zone+`"}`)
	}
	ask := func(src string) []string {
		t.Helper()
		r, err := ecsQuery(resolver, "main."+Zone, dns.TypeA, "", src)
		if err != nil {
			t.Fatalf("from %s: %v", src, err)
		}
		if r.Rcode != dns.RcodeSuccess {
			t.Fatalf("from %s: %s", src, dns.RcodeToString[r.Rcode])
		}
		return slices.Sorted(slices.Values(inOrder(r)))
	}
	for _, tc := range []struct{ src, zone string }{
		{"127.0.1.5", "a"}, {"127.0.2.5", "b"}, {"127.0.1.6", "a"}, {"127.0.2.6", "b"},
	} {
		if got := ask(tc.src); !slices.Equal(got, zoneAddrs[tc.zone]) {
			t.Errorf("a client at %s behind unbound got %v, want zone %s's %v", tc.src, got, tc.zone, zoneAddrs[tc.zone])
		}
	}
	seen := ecsQueries()
	if seen < 2 {
		t.Fatalf("the instance saw %v queries with ECS from unbound, want one per place at least", seen)
	}
	// Asked again, every answer comes from unbound's cache: the
	// instance sees nothing more.
	for _, tc := range []struct{ src, zone string }{{"127.0.1.7", "a"}, {"127.0.2.7", "b"}} {
		if got := ask(tc.src); !slices.Equal(got, zoneAddrs[tc.zone]) {
			t.Errorf("again, a client at %s got %v, want zone %s's", tc.src, got, tc.zone)
		}
	}
	if now := ecsQueries(); now != seen {
		t.Errorf("the instance saw %v more queries with ECS for answers unbound holds", now-seen)
	}
	// A third /24: zone a's network, but not in the scope of zone a's
	// cached answer (127.0.0.0/23): the instance answers it.
	if got := ask("127.0.3.5"); !slices.Equal(got, zoneAddrs["a"]) {
		t.Errorf("a client at 127.0.3.5 got %v, want zone a's %v", got, zoneAddrs["a"])
	}
	if now := ecsQueries(); now != seen+1 {
		t.Errorf("the instance saw %v queries with ECS for the third /24, want 1: unbound answered it from another scope's cache", now-seen)
	}
	t.Logf("unbound with its subnet cache: %v queries with ECS reached the instance for 7 clients in 3 /24s", ecsQueries())
}
