package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// dnssecRounds and dnssecRound: rounds of dnsperf per server, alternating
// between them, each this long.
const (
	dnssecRounds = 3
	dnssecRound  = 5 * time.Second
)

// dnssecQueries are the kinds of names a client asks, each with the DO
// bit: clusters, roles, a node, SRV, an alias chain, TXT, NXDOMAIN and
// NODATA.
var dnssecQueries = []string{
	"local." + Zone + " A",
	"primary.local." + Zone + " A",
	"standby.local." + Zone + " AAAA",
	"pg1.local." + Zone + " A",
	"_postgresql._tcp.local." + Zone + " SRV",
	"myapp-db." + Zone + " A",
	"pg1.local." + Zone + " TXT",
	"nope." + Zone + " A",
	"local." + Zone + " MX",
	Zone + " SOA",
}

// BenchmarkDNSSEC measures the QPS of one instance serving the zone signed
// by the dnssec plugin and of one serving it unsigned, from the same
// registry, in the same run: dnsperf with the DO bit, the same query mix,
// rounds alternating between the two. It prints the median of each, and
// the ratio. Run with -benchtime 1x (make bench).
func BenchmarkDNSSEC(b *testing.B) {
	perf, err := exec.LookPath("dnsperf")
	if err != nil {
		b.Fatalf("dnsperf is needed (Debian package dnsperf; scripts/setup.sh installs it): %v", err)
	}
	pg := Registry(b)
	pg.MustExec(b, `INSERT INTO pgcluster_nodes(cluster, name, address, role) VALUES
		('local', 'pg1', '192.0.2.1', 'primary'), ('local', 'pg2', '192.0.2.2', 'standby'), ('local', 'pg3', '2001:db8::3', 'standby');
		INSERT INTO pgcluster_aliases(alias, target) VALUES ('prod', 'local'), ('myapp-db', 'prod')`)
	base, _ := signingKey(b, b.TempDir())
	ns := []string{"ns ns1." + Zone + " 192.0.2.53", "ns ns2." + Zone + " 192.0.2.54"}
	signed := StartFleetInstance(b, signedCorefile(base, pg.DSN(""), ns...))
	unsigned := StartFleetInstance(b, strings.Replace(signedCorefile(base, pg.DSN(""), ns...), " dnssec {\n  key file "+base+"\n }\n", "", 1))
	queries := filepath.Join(b.TempDir(), "queries")
	if err := os.WriteFile(queries, []byte(strings.Join(dnssecQueries, "\n")+"\n"), 0o644); err != nil {
		b.Fatal(err)
	}
	qps := map[string][]float64{}
	b.ResetTimer()
	for range b.N {
		for round := 0; round < dnssecRounds; round++ {
			for _, s := range []struct {
				name string
				in   *Instance
			}{{"signed", signed}, {"unsigned", unsigned}} {
				q, lost := dnsperfRound(b, perf, s.in.Addr(), queries, "-D")
				if lost > 0 {
					b.Logf("%s round %d: %d queries lost", s.name, round, lost)
				}
				qps[s.name] = append(qps[s.name], q)
			}
		}
	}
	b.StopTimer()
	sq, uq := median(qps["signed"]), median(qps["unsigned"])
	fmt.Printf("BenchmarkDNSSEC: %d rounds of %v each, dnsperf -D (DO bit) -c 8 -q 128, %d kinds of query\n", dnssecRounds, dnssecRound, len(dnssecQueries))
	fmt.Printf("  unsigned %8.0f qps (rounds %v)\n  signed   %8.0f qps (rounds %v)\n  signed/unsigned %.2f\n",
		uq, roundQPS(qps["unsigned"]), sq, roundQPS(qps["signed"]), sq/uq)
	b.ReportMetric(sq, "signed-qps")
	b.ReportMetric(uq, "unsigned-qps")
}

// dnsperfRound runs one round of dnsperf (dnssecRound long, with the
// arguments extra: -D for the DO bit, say) against addr and returns its
// QPS and the queries lost. A SERVFAIL fails the benchmark.
func dnsperfRound(b *testing.B, perf, addr, queries string, extra ...string) (float64, int) {
	b.Helper()
	host, port, _ := strings.Cut(addr, ":")
	args := append([]string{"-s", host, "-p", port, "-d", queries, "-l", strconv.Itoa(int(dnssecRound / time.Second)),
		"-c", "8", "-q", "128", "-t", "2"}, extra...)
	out, err := exec.Command(perf, args...).CombinedOutput()
	report := string(out)
	if err != nil {
		b.Fatalf("dnsperf: %v\n%s", err, report)
	}
	q, lost, codes := perfQPS.FindStringSubmatch(report), perfLost.FindStringSubmatch(report), perfCodes.FindStringSubmatch(report)
	if q == nil || lost == nil || codes == nil {
		b.Fatalf("cannot read dnsperf's report:\n%s", report)
	}
	if strings.Contains(codes[1], "SERVFAIL") {
		b.Fatalf("dnsperf against %s: response codes %s", addr, codes[1])
	}
	v, _ := strconv.ParseFloat(q[1], 64)
	n, _ := strconv.Atoi(lost[1])
	return v, n
}

func roundQPS(v []float64) []int {
	out := make([]int, len(v))
	for i, x := range v {
		out[i] = int(x)
	}
	return out
}
