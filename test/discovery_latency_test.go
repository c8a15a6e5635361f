package test

import (
	"slices"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/discovery"
)

// TestDiscoveryLatency measures what an application pays to find the best
// node: resolution through the real zone (an alias, SRV, CNAME) plus the
// parallel probe of three real PostgreSQL servers. A PostgreSQL probe waits
// for the server's reply to SSLRequest, which comes from a freshly forked
// backend: on this kind of VM the fork dominates. Figures go to the log
// (go test -v -run TestDiscoveryLatency ./test/); only a generous bound is
// asserted.
func TestDiscoveryLatency(t *testing.T) {
	nodes := startNodes(t, 3)
	reg := Registry(t)
	register(t, reg, nodes...)
	s := StartCoreDNS(t, Corefile(reg.DSN(""), "allow_loopback"))
	c, err := discovery.New(discovery.Config{Servers: []string{s.UDP}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if _, err := c.Discover(ctx, "prod."+Zone); err != nil {
		t.Fatal(err)
	}
	const runs = 100
	lat := make([]time.Duration, 0, runs)
	for range runs {
		start := time.Now()
		res, err := c.Discover(ctx, "prod."+Zone)
		if err != nil {
			t.Fatal(err)
		}
		lat = append(lat, time.Since(start))
		if len(res.Ranking.Reachable()) != 3 {
			t.Fatalf("ranking %v, want 3 reachable nodes", res.Ranking)
		}
	}
	slices.Sort(lat)
	p50, p99 := lat[runs/2], lat[runs*99/100]
	t.Logf("resolve + probe, 3 real nodes through the real zone, %d runs: p50 %v p99 %v", runs, p50.Round(time.Microsecond), p99.Round(time.Microsecond))
	// The resolution alone, without the probe.
	res := make([]time.Duration, 0, runs)
	for range runs {
		start := time.Now()
		if _, err := c.Resolve(ctx, "prod."+Zone); err != nil {
			t.Fatal(err)
		}
		res = append(res, time.Since(start))
	}
	slices.Sort(res)
	t.Logf("resolve alone (alias, SRV, addresses), %d runs: p50 %v p99 %v", runs, res[runs/2].Round(time.Microsecond), res[runs*99/100].Round(time.Microsecond))
	if p99 > time.Second {
		t.Errorf("p99 %v: resolve + probe on loopback should take milliseconds", p99)
	}
}
