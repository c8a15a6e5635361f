package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// topologyQueries are the names a client of a cluster asks: its name, its
// roles, an alias, SRV.
var topologyQueries = []string{
	"main." + Zone + " A",
	"primary.main." + Zone + " A",
	"standby.main." + Zone + " A",
	"prod." + Zone + " A",
	"_postgresql._tcp.main." + Zone + " SRV",
}

// BenchmarkTopologyQPS measures the QPS of one instance with topology local
// and of one with topology off, from the same registry (cluster main of 60
// nodes in 20 zones, 100 client networks), in the same run: dnsperf with
// the same ECS option on every query (10.1.7.0/24, in zone z1's network)
// and the same query mix, rounds alternating between the two. It prints
// the median of each and the ratio. Run with -benchtime 1x (make bench).
func BenchmarkTopologyQPS(b *testing.B) {
	perf, err := exec.LookPath("dnsperf")
	if err != nil {
		b.Fatalf("dnsperf is needed (Debian package dnsperf; scripts/setup.sh installs it): %v", err)
	}
	pg := Registry(b)
	pg.MustExec(b, `INSERT INTO pgcluster_nodes(cluster, name, address, role, region, zone)
  SELECT 'main', 'n' || i, ('192.0.2.' || (i + 1))::inet, CASE WHEN i = 0 THEN 'primary' ELSE 'standby' END,
    'r' || (i % 20 / 5), 'z' || (i % 20)
  FROM generate_series(0, 59) i;
INSERT INTO pgcluster_networks(network, region, zone)
  SELECT ('10.' || i || '.0.0/16')::cidr, 'r' || (i % 20 / 5), 'z' || (i % 20) FROM generate_series(0, 99) i;
INSERT INTO pgcluster_aliases VALUES ('prod', 'main')`)
	start := func(mode string) *Instance {
		return StartFleetInstance(b, fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n pgcluster {\n  postgres %s\n  topology %s\n }\n}\n",
			Zone, PortPlaceholder, pg.DSN(""), mode))
	}
	local, off := start("local"), start("off")
	queries := filepath.Join(b.TempDir(), "queries")
	if err := os.WriteFile(queries, []byte(strings.Join(topologyQueries, "\n")+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	// ECS (option 8): family 1, source /24, scope 0, 10.1.7.
	const ecs = "8:00011800" + "0a0107"
	qps := map[string][]float64{}
	b.ResetTimer()
	for range b.N {
		for round := 0; round < dnssecRounds; round++ {
			for _, s := range []struct {
				name string
				in   *Instance
			}{{"local", local}, {"off", off}} {
				q, lost := dnsperfRound(b, perf, s.in.Addr(), queries, "-E", ecs)
				if lost > 0 {
					b.Logf("%s round %d: %d queries lost", s.name, round, lost)
				}
				qps[s.name] = append(qps[s.name], q)
			}
		}
	}
	b.StopTimer()
	lq, oq := median(qps["local"]), median(qps["off"])
	fmt.Printf("BenchmarkTopologyQPS: %d rounds of %v each, dnsperf -E (ECS 10.1.7.0/24 on every query) -c 8 -q 128, %d kinds of query, 60 nodes in 20 zones, 100 networks\n",
		dnssecRounds, dnssecRound, len(topologyQueries))
	fmt.Printf("  topology off   %8.0f qps (rounds %v)\n  topology local %8.0f qps (rounds %v)\n  local/off %.2f\n",
		oq, roundQPS(qps["off"]), lq, roundQPS(qps["local"]), lq/oq)
	b.ReportMetric(lq, "local-qps")
	b.ReportMetric(oq, "off-qps")
}
