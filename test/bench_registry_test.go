package test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster"
)

// Figures of BenchmarkRegistryScale.
const (
	// stormUpdates single-row updates are written in each scaleRound of
	// the write-storm measurement, evenly spaced.
	stormUpdates = 5000
	// scaleRounds rounds of dnsperf, each scaleRound long, per query kind
	// and server, in alternating order.
	scaleRounds = 3
	scaleRound  = 5 * time.Second
	// scaleChanges address changes per registry size; scaleChangeBudget
	// bounds the time they may take at one size (the rest are skipped and
	// the table says how many were made), scaleChangeTimeout one change.
	scaleChanges       = 20
	scaleChangeBudget  = 90 * time.Second
	scaleChangeTimeout = 30 * time.Second
	// scalePoll is the pause between two queries while waiting for a change.
	scalePoll = time.Millisecond
	// scaleWindow is how long the CPU of an instance is measured while the
	// heartbeats are written: the default refresh, so one full refresh
	// poll falls in each window. scaleSettle comes before it.
	scaleWindow = 30 * time.Second
	scaleSettle = 3 * time.Second
	// scaleHeartbeatTick: every tick one tenth of the nodes writes its
	// heartbeat, so each node writes one a second.
	scaleHeartbeatTick = 100 * time.Millisecond
	// scaleBig is the size of the cluster of the large answer.
	scaleBig = 200
	// userHZ is the unit of utime and stime in /proc/PID/stat (USER_HZ,
	// 100 on Linux whatever the kernel's HZ).
	userHZ = 100
)

// Zones of the other two server blocks of the QPS instance.
const (
	fileZone   = "file.lan."
	whoamiZone = "whoami.lan."
)

// scaleShape is the size of a registry: nodes spread evenly over clusters
// (c0000, c0001, …; nodes n000, n001, … of which n000 is the primary),
// aliases a0000, a0001, … each to one cluster.
type scaleShape struct {
	nodes, clusters, aliases int
}

func (s scaleShape) String() string {
	return fmt.Sprintf("%s / %s / %s", thousands(s.nodes), thousands(s.clusters), thousands(s.aliases))
}

// BenchmarkRegistryScale is the registry's end-to-end benchmark at a
// provider's scale (docs/performance.md's tables come from it): a real
// PostgreSQL on loopback, the built bin/coredns as a separate process and
// dnsperf. It prints one table:
//
//   - QPS of pgcluster, CoreDNS's file plugin serving a zone file written
//     from the same registry rows, and whoami (the ceiling), all three
//     server blocks of one bin/coredns, for a cluster name, an alias,
//     NXDOMAIN, SRV and a 200-node cluster, in alternating rounds;
//   - COMMIT → answer at 100, 10,000 and 50,000 nodes: one node's address
//     changes in a transaction and the instance is asked every millisecond
//     until it answers the new address; RSS of the instance at each size;
//   - CPU of the instance while 10,000 nodes write their heartbeat once a
//     second, without and with stale_after 5s, and whether the SOA serial
//     stayed the same.
//
// b.N is ignored: one run is one measurement. Not part of make test:
//
//	go test -run '^$' -bench RegistryScale -benchtime 1x -timeout 30m ./test/
func BenchmarkRegistryScale(b *testing.B) {
	perf, err := exec.LookPath(dnsperfPath)
	if err != nil {
		b.Fatalf("dnsperf is missing (the setup script installs it: apt-get install -y dnsperf): %v", err)
	}
	start := time.Now()
	pg := Registry(b)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.DSN(""))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)

	qpsShape := scaleShape{10000, 1000, 1000}
	qps := benchQPS(b, perf, conn, pg.DSN(""), qpsShape)

	var lats []scaleLatency
	for _, s := range []scaleShape{{100, 10, 1}, {10000, 1000, 1000}, {50000, 1000, 1000}, {50000, 5000, 5000}} {
		lats = append(lats, benchChanges(b, conn, pg.DSN(""), s))
	}

	hbShape := scaleShape{10000, 1000, 1000}
	loadShape(b, conn, hbShape, false)
	hbCtx, stopHeartbeats := context.WithCancel(ctx)
	hb := startHeartbeats(hbCtx, b, pg.DSN(""))
	var cpus []scaleCPU
	for _, stale := range []string{"", "5s"} {
		cpus = append(cpus, benchHeartbeatCPU(b, pg.DSN(""), hbShape, stale, hb))
	}
	stopHeartbeats()
	writes, rows, hbErr := hb.wait()
	if hbErr != nil {
		b.Fatalf("heartbeat writer: %v", hbErr)
	}

	printScale(qps, qpsShape, lats, cpus, writes, rows, time.Since(start))
	reportScale(b, qps, lats, cpus)
}

// loadShape replaces the registry's rows with s, plus the 200-node cluster
// "big" when big is set. All addresses are documentation addresses.
func loadShape(t testing.TB, conn *pgx.Conn, s scaleShape, big bool) {
	t.Helper()
	sql := fmt.Sprintf(`
TRUNCATE pgcluster_nodes, pgcluster_aliases;
INSERT INTO pgcluster_nodes(cluster, name, address, role)
SELECT 'c' || lpad((i %% %[2]d)::text, 4, '0'), 'n' || lpad((i / %[2]d)::text, 3, '0'),
       '192.0.2.0'::inet + (i / %[2]d + 1),
       CASE WHEN i < %[2]d THEN 'primary' ELSE 'standby' END
  FROM generate_series(0, %[1]d - 1) i;
INSERT INTO pgcluster_aliases(alias, target)
SELECT 'a' || lpad(j::text, 4, '0'), 'c' || lpad((j %% %[2]d)::text, 4, '0')
  FROM generate_series(0, %[3]d - 1) j;`, s.nodes, s.clusters, s.aliases)
	if big {
		sql += fmt.Sprintf(`
INSERT INTO pgcluster_nodes(cluster, name, address, role)
SELECT 'big', 'n' || lpad(k::text, 3, '0'), '198.51.100.0'::inet + (k + 1),
       CASE WHEN k = 0 THEN 'primary' ELSE 'standby' END
  FROM generate_series(0, %d - 1) k;`, scaleBig)
	}
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Fatalf("load %v: %v", s, err)
	}
}

// lastNode is the name of the last node of the last cluster of s: once it
// answers, the instance has loaded s.
func lastNode(s scaleShape) string {
	return fmt.Sprintf("n%03d.c%04d.%s", (s.nodes-1)/s.clusters, s.clusters-1, Zone)
}

// startScaleInstance starts bin/coredns with corefile and waits until it
// answers name with an address.
func startScaleInstance(t testing.TB, corefile, name string) *Instance {
	t.Helper()
	in := StartFleetInstance(t, corefile)
	Eventually(t, 2*time.Minute, func() error {
		r, err := Exchange("udp", in.Addr(), name, dns.TypeA)
		if err != nil {
			return err
		}
		if len(Addrs(r)) == 0 {
			return fmt.Errorf("%s: no address yet (%s)", name, dns.RcodeToString[r.Rcode])
		}
		return nil
	})
	return in
}

// pgclusterCorefile serves Zone from the registry at dsn with the
// prometheus plugin on {METRICS} and extra pgcluster options.
func pgclusterCorefile(dsn string, options ...string) string {
	return fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n prometheus 127.0.0.1:%s\n pgcluster {\n  postgres %s\n  %s\n }\n}\n",
		Zone, PortPlaceholder, MetricsPlaceholder, dsn, strings.Join(options, "\n  "))
}

// stopInstance stops an instance before the next phase, so that it takes
// no CPU or memory from it.
func stopInstance(t testing.TB, in *Instance) {
	t.Helper()
	if err := in.Term(); err != nil {
		t.Fatal(err)
	}
}

// QPS.

// scaleKind is one kind of query of the QPS table.
type scaleKind struct {
	name  string
	rcode int
	lines func(zone string) string // dnsperf's query file for zone
}

var scaleKinds = []scaleKind{
	{"cluster A", dns.RcodeSuccess, func(z string) string {
		return queryLines(func(i int) string { return fmt.Sprintf("c%04d.%s A", i*10, z) })
	}},
	{"alias A (CNAME)", dns.RcodeSuccess, func(z string) string {
		return queryLines(func(i int) string { return fmt.Sprintf("a%04d.%s A", i*10+1, z) })
	}},
	{"NXDOMAIN", dns.RcodeNameError, func(z string) string {
		return queryLines(func(i int) string { return fmt.Sprintf("missing%d.%s A", i, z) })
	}},
	{"SRV", dns.RcodeSuccess, func(z string) string {
		return queryLines(func(i int) string { return fmt.Sprintf("_postgresql._tcp.c%04d.%s SRV", i*10, z) })
	}},
	{"200-node A", dns.RcodeSuccess, func(z string) string { return "big." + z + " A\n" }},
}

// queryLines is 100 lines of a dnsperf query file.
func queryLines(line func(i int) string) string {
	var sb strings.Builder
	for i := range 100 {
		sb.WriteString(line(i) + "\n")
	}
	return sb.String()
}

// scaleServers are the three server blocks of the QPS instance, by zone.
var scaleServers = []struct{ name, zone string }{
	{"pgcluster", Zone}, {"file", fileZone}, {"whoami", whoamiZone},
}

// scaleQPS holds, per kind and server, the QPS of each round, and what one
// query of each answers.
type scaleQPS struct {
	rounds  map[string]map[string][]float64
	answers map[string]map[string]string
	lost    int
	// storm holds, per round, the cluster A QPS of pgcluster during a storm
	// of updates to the registry it follows ("followed") and during the
	// same storm on a copy of the registry nobody follows ("copy"), and
	// stormRate the updates per second each storm achieved.
	storm     map[string][]float64
	stormRate map[string][]float64
}

func (q scaleQPS) median(kind, server string) float64 {
	s := slices.Clone(q.rounds[kind][server])
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// benchQPS loads s and the 200-node cluster, writes the file plugin's zone
// from the rows, starts one bin/coredns serving the three blocks, and runs
// dnsperf against each in alternating rounds.
func benchQPS(b *testing.B, perf string, conn *pgx.Conn, dsn string, s scaleShape) scaleQPS {
	b.Helper()
	loadShape(b, conn, s, true)
	dir := b.TempDir()
	zonefile := filepath.Join(dir, "db.file.lan")
	if err := os.WriteFile(zonefile, []byte(zoneFromRows(b, conn, fileZone)), 0o644); err != nil {
		b.Fatal(err)
	}
	corefile := fmt.Sprintf("%[1]s:%[2]s {\n bind 127.0.0.1\n pgcluster {\n  postgres %[3]s\n }\n}\n"+
		"%[4]s:%[2]s {\n bind 127.0.0.1\n file %[5]s\n}\n"+
		"%[6]s:%[2]s {\n bind 127.0.0.1\n whoami\n}\n",
		Zone, PortPlaceholder, dsn, fileZone, zonefile, whoamiZone)
	in := startScaleInstance(b, corefile, "big."+Zone)
	defer stopInstance(b, in)

	q := scaleQPS{rounds: map[string]map[string][]float64{}, answers: map[string]map[string]string{}}
	files := map[string]map[string]string{}
	for _, k := range scaleKinds {
		q.rounds[k.name] = map[string][]float64{}
		q.answers[k.name] = map[string]string{}
		files[k.name] = map[string]string{}
		for _, srv := range scaleServers {
			f := filepath.Join(dir, strings.ReplaceAll(k.name+"-"+srv.name, " ", "_"))
			lines := k.lines(srv.zone)
			if err := os.WriteFile(f, []byte(lines), 0o644); err != nil {
				b.Fatal(err)
			}
			files[k.name][srv.name] = f
			// Each server answers the kind as it should before it is measured.
			first := strings.Fields(lines)
			want, empty := k.rcode, k.rcode != dns.RcodeSuccess
			if srv.name == "whoami" {
				// whoami answers every name, its address in the additional section.
				want, empty = dns.RcodeSuccess, true
			}
			q.answers[k.name][srv.name] = describeAnswer(b, in.Addr(), first[0], dns.StringToType[first[1]], want, empty)
		}
	}
	for round := range scaleRounds {
		for _, k := range scaleKinds {
			for i := range scaleServers {
				srv := scaleServers[(i+round)%len(scaleServers)]
				qps, lost := runDNSPerf(b, perf, in.Addr(), files[k.name][srv.name], srv.name == "whoami", k.rcode)
				q.rounds[k.name][srv.name] = append(q.rounds[k.name][srv.name], qps)
				q.lost += lost
			}
		}
	}
	benchStorm(b, perf, conn, dsn, in, files["cluster A"]["pgcluster"], s, &q)
	return q
}

// benchStorm measures pgcluster's cluster A QPS while stormUpdates
// single-row updates a round go to the registry it follows, against the
// same storm on a copy of the registry in another database that no
// instance follows: the ratio is pgcluster's own cost of following the
// storm, PostgreSQL's cost on the same cores being in both.
func benchStorm(b *testing.B, perf string, conn *pgx.Conn, dsn string, in *Instance, queries string, s scaleShape, q *scaleQPS) {
	b.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS storm_copy"); err != nil {
		b.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE storm_copy"); err != nil {
		b.Fatal(err)
	}
	copyDSN := strings.Replace(dsn, "/postgres?", "/storm_copy?", 1)
	cp, err := pgx.Connect(ctx, copyDSN)
	if err != nil {
		b.Fatal(err)
	}
	defer cp.Close(ctx)
	if _, err := cp.Exec(ctx, pgcluster.Schema); err != nil {
		b.Fatal(err)
	}
	loadShape(b, cp, s, true)
	q.storm, q.stormRate = map[string][]float64{}, map[string][]float64{}
	targets := map[string]*pgx.Conn{"followed": conn, "copy": cp}
	for round := range scaleRounds {
		for i, which := range []string{"followed", "copy"} {
			if round%2 == 1 {
				which = []string{"copy", "followed"}[i]
			}
			done := make(chan float64)
			go func() { done <- storm(b, targets[which], s, round) }()
			qps, lost := runDNSPerf(b, perf, in.Addr(), queries, false, dns.RcodeSuccess)
			q.storm[which] = append(q.storm[which], qps)
			q.stormRate[which] = append(q.stormRate[which], <-done)
			q.lost += lost
		}
	}
}

// storm writes stormUpdates single-row updates, one transaction each,
// evenly spaced over scaleRound, each moving a node of a different cluster
// to another address, and returns how many it wrote a second.
func storm(t testing.TB, conn *pgx.Conn, s scaleShape, round int) float64 {
	ctx := context.Background()
	start := time.Now()
	every := scaleRound / stormUpdates
	for i := range stormUpdates {
		time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
		cluster := fmt.Sprintf("c%04d", i%s.clusters)
		addr := fmt.Sprintf("198.18.%d.%d", round, 1+i%250)
		if _, err := conn.Exec(ctx, "UPDATE pgcluster_nodes SET address = $1 WHERE cluster = $2 AND name = 'n002'", addr, cluster); err != nil {
			t.Errorf("storm: %v", err)
			return 0
		}
	}
	return float64(stormUpdates) / time.Since(start).Seconds()
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// describeAnswer asks addr once, with EDNS0 as dnsperf -e does, checks the
// rcode (and, unless empty may be, that the answer section holds records)
// and says what came back: the records of the answer and additional
// sections, and TC.
func describeAnswer(t testing.TB, addr, name string, qtype uint16, rcode int, empty bool) string {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(4096, false)
	c := &dns.Client{Net: "udp", Timeout: 2 * time.Second, UDPSize: 4096}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("%s %s to %s: %v", name, dns.TypeToString[qtype], addr, err)
	}
	if r.Rcode != rcode {
		t.Fatalf("%s %s to %s: %s, want %s", name, dns.TypeToString[qtype], addr, dns.RcodeToString[r.Rcode], dns.RcodeToString[rcode])
	}
	if !empty && len(r.Answer) == 0 {
		t.Fatalf("%s %s to %s: empty answer", name, dns.TypeToString[qtype], addr)
	}
	extra := 0
	for _, rr := range r.Extra {
		if _, ok := rr.(*dns.OPT); !ok {
			extra++
		}
	}
	d := fmt.Sprintf("%d+%d rr", len(r.Answer), extra)
	if r.Truncated {
		d += " TC"
	}
	return d
}

var (
	perfQPS   = regexp.MustCompile(`Queries per second:\s+([\d.]+)`)
	perfLost  = regexp.MustCompile(`Queries lost:\s+(\d+)`)
	perfCodes = regexp.MustCompile(`Response codes:\s+(.*)`)
)

// runDNSPerf runs one round of dnsperf with queries against addr and
// returns its QPS and how many queries were lost. An rcode other than the
// kind's (NOERROR for whoami) fails the benchmark.
func runDNSPerf(t testing.TB, perf, addr, queries string, whoami bool, rcode int) (float64, int) {
	t.Helper()
	host, port, _ := strings.Cut(addr, ":")
	secs := strconv.Itoa(int(scaleRound / time.Second))
	out, err := exec.Command(perf, "-s", host, "-p", port, "-d", queries, "-l", secs,
		"-c", "8", "-q", "128", "-t", "2", "-e").CombinedOutput()
	report := string(out)
	if err != nil {
		t.Fatalf("dnsperf %s: %v\n%s", queries, err, report)
	}
	qps, lost, codes := perfQPS.FindStringSubmatch(report), perfLost.FindStringSubmatch(report), perfCodes.FindStringSubmatch(report)
	if qps == nil || lost == nil || codes == nil {
		t.Fatalf("cannot read dnsperf's report:\n%s", report)
	}
	want := dns.RcodeToString[rcode]
	if whoami {
		want = "NOERROR"
	}
	for _, c := range strings.Split(codes[1], ",") {
		if code, _, _ := strings.Cut(strings.TrimSpace(c), " "); code != want {
			t.Fatalf("dnsperf %s: response codes %s, want only %s", queries, codes[1], want)
		}
	}
	v, _ := strconv.ParseFloat(qps[1], 64)
	n, _ := strconv.Atoi(lost[1])
	return v, n
}

// zoneFromRows writes a zone file for origin holding the records pgcluster
// serves for the registry's rows (every node healthy and serving): per
// cluster its addresses, primary., standby., replica., prefer-standby., the
// SRV sets under each, each node's name, TXT for the cluster and each node;
// an alias is a CNAME to its target.
func zoneFromRows(t testing.TB, conn *pgx.Conn, origin string) string {
	t.Helper()
	ctx := context.Background()
	type row struct {
		cluster, name, role string
		addr                netip.Addr
		port                int
	}
	rows, err := conn.Query(ctx, `SELECT cluster, name, host(address), port, role FROM pgcluster_nodes ORDER BY cluster, name`)
	if err != nil {
		t.Fatal(err)
	}
	var nodes []row
	for rows.Next() {
		var r row
		var addr string
		if err := rows.Scan(&r.cluster, &r.name, &addr, &r.port, &r.role); err != nil {
			t.Fatal(err)
		}
		r.addr = netip.MustParseAddr(addr)
		nodes = append(nodes, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "$ORIGIN %s\n$TTL 5\n@ IN SOA ns.%s hostmaster.%s 1 7200 1800 86400 5\n@ IN NS ns\nns IN A 192.0.2.254\n", origin, origin, origin)
	rr := func(owner string, a netip.Addr) {
		typ := "A"
		if a.Is6() {
			typ = "AAAA"
		}
		fmt.Fprintf(&sb, "%s IN %s %s\n", owner, typ, a)
	}
	for i := 0; i < len(nodes); {
		j := i
		var primaries []string
		for j < len(nodes) && nodes[j].cluster == nodes[i].cluster {
			if nodes[j].role == "primary" {
				primaries = append(primaries, nodes[j].name)
			}
			j++
		}
		c := nodes[i].cluster
		fmt.Fprintf(&sb, "%s IN TXT \"serving=%d\" \"out=0\" \"primary=%s\"\n", c, j-i, strings.Join(primaries, ","))
		for _, n := range nodes[i:j] {
			target := n.name + "." + c
			sets := []string{""}
			if n.role == "primary" {
				sets = append(sets, "primary.")
			} else {
				sets = append(sets, "standby.", "replica.", "prefer-standby.")
			}
			for _, set := range sets {
				rr(set+c, n.addr)
				fmt.Fprintf(&sb, "_postgresql._tcp.%s%s IN SRV 0 0 %d %s\n", set, c, n.port, target)
			}
			rr(target, n.addr)
			fmt.Fprintf(&sb, "%s IN TXT \"state=in\" \"role=%s\" \"address=%s\" \"port=%d\" \"reason=serving\"\n", target, n.role, n.addr, n.port)
		}
		i = j
	}
	arows, err := conn.Query(ctx, `SELECT alias, target FROM pgcluster_aliases ORDER BY alias`)
	if err != nil {
		t.Fatal(err)
	}
	for arows.Next() {
		var alias, target string
		if err := arows.Scan(&alias, &target); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&sb, "%s IN CNAME %s.%s\n", alias, target, origin)
	}
	if err := arows.Err(); err != nil {
		t.Fatal(err)
	}
	return sb.String()
}

// COMMIT → answer and RSS.

// scaleLatency is what benchChanges measured at one size.
type scaleLatency struct {
	shape       scaleShape
	lat         []time.Duration
	rssLoaded   int64 // bytes, once loaded
	rssChanged  int64 // bytes, after the changes
	reloadMean  time.Duration
	reloadCount float64
}

// benchChanges loads s, starts an instance and changes one node's address
// scaleChanges times (within scaleChangeBudget), each in its own
// transaction, asking the instance every millisecond from the COMMIT on
// until it answers the new address.
func benchChanges(b *testing.B, conn *pgx.Conn, dsn string, s scaleShape) scaleLatency {
	b.Helper()
	ctx := context.Background()
	loadShape(b, conn, s, false)
	in := startScaleInstance(b, pgclusterCorefile(dsn), lastNode(s))
	defer stopInstance(b, in)
	time.Sleep(scaleSettle) // the load's garbage collected, before RSS is read
	res := scaleLatency{shape: s, rssLoaded: procRSS(b, in.Pid())}
	sum0, count0 := reloadStats(b, in)

	c := &dns.Client{Net: "udp", Timeout: 100 * time.Millisecond}
	began := time.Now()
	for i := range scaleChanges {
		if i > 0 && time.Since(began) > scaleChangeBudget {
			break
		}
		cluster := fmt.Sprintf("c%04d", (i*7919)%s.clusters)
		want := fmt.Sprintf("203.0.113.%d", i+1)
		name := "n001." + cluster + "." + Zone
		tx, err := conn.Begin(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `UPDATE pgcluster_nodes SET address = $1 WHERE cluster = $2 AND name = 'n001'`, want, cluster); err != nil {
			b.Fatal(err)
		}
		committed := time.Now()
		if err := tx.Commit(ctx); err != nil {
			b.Fatal(err)
		}
		lat, err := waitAnswer(c, in.Addr(), name, want, committed)
		if err != nil {
			b.Fatalf("%v: change %d: %v", s, i, err)
		}
		res.lat = append(res.lat, lat)
	}
	res.rssChanged = procRSS(b, in.Pid())
	sum1, count1 := reloadStats(b, in)
	if res.reloadCount = count1 - count0; res.reloadCount > 0 {
		res.reloadMean = time.Duration((sum1 - sum0) / res.reloadCount * float64(time.Second))
	}
	return res
}

// waitAnswer asks addr for name's A record every scalePoll until it is
// want, and returns the time since from.
func waitAnswer(c *dns.Client, addr, name, want string, from time.Time) (time.Duration, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	next := from
	var last string
	for {
		r, _, err := c.Exchange(m, addr)
		if err != nil {
			last = err.Error()
		} else if got := Addrs(r); len(got) == 1 && got[0] == want {
			return time.Since(from), nil
		} else {
			last = fmt.Sprint(got)
		}
		if time.Since(from) > scaleChangeTimeout {
			return 0, fmt.Errorf("%s still answers %s after %v, want %s", name, last, scaleChangeTimeout, want)
		}
		next = next.Add(scalePoll)
		time.Sleep(time.Until(next))
	}
}

// reloadStats reads the sum and count of the instance's reload durations.
func reloadStats(t testing.TB, in *Instance) (sum, count float64) {
	t.Helper()
	name := "coredns_pgcluster_registry_reload_duration_seconds"
	return metric(t, in, fleetMetric(name+"_sum")), metric(t, in, fleetMetric(name+"_count"))
}

// Heartbeats.

// heartbeats writes heartbeats until its context ends.
type heartbeats struct {
	wg     sync.WaitGroup
	writes int
	rows   int64
	err    error
	// skip is a node ("cluster/name") whose heartbeat is no longer written.
	skip atomic.Pointer[string]
}

// startHeartbeats starts a writer that, every scaleHeartbeatTick, sets the
// heartbeat of the nodes whose name ends in the tick's digit (one tenth of
// them): each node writes its heartbeat once a second.
func startHeartbeats(ctx context.Context, t testing.TB, dsn string) *heartbeats {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	h := &heartbeats{}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		defer conn.Close(context.Background())
		tick := time.NewTicker(scaleHeartbeatTick)
		defer tick.Stop()
		for slot := 0; ; slot = (slot + 1) % 10 {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			skip := ""
			if p := h.skip.Load(); p != nil {
				skip = *p
			}
			tag, err := conn.Exec(ctx, `UPDATE pgcluster_nodes SET heartbeat = now() WHERE right(name, 1) = $1 AND cluster || '/' || name <> $2`, strconv.Itoa(slot), skip)
			if err != nil {
				if ctx.Err() == nil {
					h.err = err
				}
				return
			}
			h.writes++
			h.rows += tag.RowsAffected()
		}
	}()
	return h
}

// wait waits for the writer to stop and returns its statements, rows and
// error.
func (h *heartbeats) wait() (int, int64, error) {
	h.wg.Wait()
	return h.writes, h.rows, h.err
}

// scaleCPU is what benchHeartbeatCPU measured.
type scaleCPU struct {
	staleAfter       string
	cores            float64 // CPU time / wall time
	reloads          float64
	serial0, serial1 uint32
	rss              int64
	// left is, with stale_after, how long after its last heartbeat a node
	// whose heartbeats stopped was no longer answered.
	left time.Duration
}

// benchHeartbeatCPU starts an instance (with stale_after when given) on
// the registry the heartbeats are written to and measures its CPU over
// scaleWindow, the reloads it made and its SOA serial before and after.
//
// With stale_after, one node's heartbeats then stop, and the time from its
// last heartbeat to its leaving the answers is measured.
func benchHeartbeatCPU(b *testing.B, dsn string, s scaleShape, staleAfter string, h *heartbeats) scaleCPU {
	b.Helper()
	var opts []string
	if staleAfter != "" {
		opts = append(opts, "stale_after "+staleAfter)
	}
	in := startScaleInstance(b, pgclusterCorefile(dsn, opts...), lastNode(s))
	defer stopInstance(b, in)
	time.Sleep(scaleSettle)
	res := scaleCPU{staleAfter: staleAfter}
	okReloads := `coredns_pgcluster_registry_reloads_total{result="ok",zone="` + Zone + `"}`
	r0 := metric(b, in, okReloads)
	res.serial0 = soaSerial(b, in.Addr())
	cpu0, t0 := procCPU(b, in.Pid()), time.Now()
	time.Sleep(scaleWindow)
	cpu1, t1 := procCPU(b, in.Pid()), time.Now()
	res.serial1 = soaSerial(b, in.Addr())
	res.reloads = metric(b, in, okReloads) - r0
	res.cores = (cpu1 - cpu0).Seconds() / t1.Sub(t0).Seconds()
	res.rss = procRSS(b, in.Pid())
	if staleAfter != "" {
		res.left = staleLeave(b, dsn, in, h)
	}
	return res
}

// staleLeave stops the heartbeats of node n001 of c0000 and returns how
// long after its last one the instance stopped answering its address.
func staleLeave(b *testing.B, dsn string, in *Instance, h *heartbeats) time.Duration {
	b.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	skip := "c0000/n001"
	h.skip.Store(&skip)
	defer h.skip.Store(nil)
	// A whole round of the writer: the heartbeat read now is the last.
	time.Sleep(10 * scaleHeartbeatTick)
	var last time.Time
	if err := conn.QueryRow(ctx, `SELECT heartbeat FROM pgcluster_nodes WHERE cluster = 'c0000' AND name = 'n001'`).Scan(&last); err != nil {
		b.Fatal(err)
	}
	m := new(dns.Msg)
	m.SetQuestion("n001.c0000."+Zone, dns.TypeA)
	c := &dns.Client{Net: "udp", Timeout: 100 * time.Millisecond}
	for time.Since(last) < time.Minute {
		if r, _, err := c.Exchange(m, in.Addr()); err == nil && r.Rcode == dns.RcodeSuccess && len(Addrs(r)) == 0 {
			return time.Since(last)
		}
		time.Sleep(scalePoll)
	}
	b.Fatalf("n001.c0000 still answered a minute after its last heartbeat")
	return 0
}

// soaSerial asks addr for Zone's SOA serial.
func soaSerial(t testing.TB, addr string) uint32 {
	t.Helper()
	r := MustQuery(t, "udp", addr, Zone, dns.TypeSOA)
	if len(r.Answer) == 0 {
		t.Fatalf("SOA %s: no answer", Zone)
	}
	soa, ok := r.Answer[0].(*dns.SOA)
	if !ok {
		t.Fatalf("SOA %s: %v", Zone, r.Answer[0])
	}
	return soa.Serial
}

// /proc.

// procCPU returns the user and system CPU time the process has used.
func procCPU(t testing.TB, pid int) time.Duration {
	t.Helper()
	d, err := readProcCPU(pid)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// readProcCPU is procCPU's reading, with an error for the caller that
// must not fail the test (another goroutine's).
func readProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command, which is in parentheses and may hold spaces:
	// state is field 3, utime 14 and stime 15.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, s)
	}
	return time.Duration(utime+stime) * time.Second / userHZ, nil
}

// procRSS returns the process's resident set size (VmRSS) in bytes.
func procRSS(t testing.TB, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("/proc/%d/status: %q", pid, l)
			}
			return kb * 1024
		}
	}
	t.Fatalf("/proc/%d/status has no VmRSS", pid)
	return 0
}

// The table.

func printScale(q scaleQPS, qs scaleShape, lats []scaleLatency, cpus []scaleCPU, writes int, rows int64, took time.Duration) {
	fmt.Printf("\nBenchmarkRegistryScale: bin/coredns (%s, %d cores), PostgreSQL and dnsperf on loopback; took %v\n",
		runtime.Version(), runtime.NumCPU(), took.Round(time.Second))

	fmt.Printf("\nQPS: one bin/coredns, three server blocks; registry %v plus a %d-node cluster (file: a zone file written from the same rows)\n",
		qs, scaleBig)
	fmt.Printf("dnsperf -c 8 -q 128 -e, %d alternating rounds of %v per kind and server, median; %d queries lost in all\n",
		scaleRounds, scaleRound, q.lost)
	fmt.Printf("%-16s %10s %10s %10s %8s %9s   %s\n", "query", "pgcluster", "file", "whoami", "pg/file", "pg/whoami", "one answer (EDNS0 4096): pgcluster | file | whoami")
	for _, k := range scaleKinds {
		pg, file, who := q.median(k.name, "pgcluster"), q.median(k.name, "file"), q.median(k.name, "whoami")
		fmt.Printf("%-16s %10.0f %10.0f %10.0f %7.2fx %8.2fx   %s | %s | %s\n", k.name, pg, file, who, pg/file, pg/who,
			q.answers[k.name]["pgcluster"], q.answers[k.name]["file"], q.answers[k.name]["whoami"])
	}
	fmt.Println("each round (pgcluster / file / whoami; which runs first turns from round to round):")
	for _, k := range scaleKinds {
		fmt.Printf("  %-16s", k.name)
		for i := range scaleRounds {
			fmt.Printf("  %.0f / %.0f / %.0f", q.rounds[k.name]["pgcluster"][i], q.rounds[k.name]["file"][i], q.rounds[k.name]["whoami"][i])
		}
		fmt.Println()
	}

	followed, cp := median(q.storm["followed"]), median(q.storm["copy"])
	fmt.Printf("\nWrite storm: %d single-row updates (one a transaction) in each %v round, to the registry pgcluster follows or to a copy nobody follows\n",
		stormUpdates, scaleRound)
	fmt.Printf("pgcluster cluster A QPS, median of %d rounds: followed %.0f (%.0f updates/s), copy %.0f (%.0f updates/s): %.2fx\n",
		scaleRounds, followed, median(q.stormRate["followed"]), cp, median(q.stormRate["copy"]), followed/cp)
	fmt.Print("each round (followed / copy; which runs first turns from round to round):")
	for i := range scaleRounds {
		fmt.Printf("  %.0f / %.0f", q.storm["followed"][i], q.storm["copy"][i])
	}
	fmt.Println()

	fmt.Printf("\nCOMMIT -> answer: one node's address per transaction, the instance asked every %v from the COMMIT on\n", scalePoll)
	fmt.Printf("%-26s %7s %9s %9s %9s %12s %14s %12s\n", "nodes / clusters / aliases", "changes", "p50", "p99", "max", "reload mean", "RSS loaded", "RSS after")
	for _, l := range lats {
		fmt.Printf("%-26s %7d %9s %9s %9s %12s %11.0f MB %9.0f MB\n", l.shape, len(l.lat),
			ms(percentile(l.lat, 50)), ms(percentile(l.lat, 99)), ms(slices.Max(l.lat)), ms(l.reloadMean),
			mb(l.rssLoaded), mb(l.rssChanged))
	}

	fmt.Printf("\nHeartbeats: 10,000 nodes, each writing its heartbeat once a second (%d UPDATEs of %s rows in all, every %v)\n",
		writes, thousands(int(rows)), scaleHeartbeatTick)
	fmt.Printf("%-20s %12s %18s %22s %10s %s\n", "instance", "CPU (cores)", "reloads in window", "SOA serial", "RSS", "  a node whose heartbeats stop leaves")
	for _, c := range cpus {
		name := "stale_after off"
		if c.staleAfter != "" {
			name = "stale_after " + c.staleAfter
		}
		same := "unchanged"
		if c.serial0 != c.serial1 {
			same = fmt.Sprintf("%d -> %d", c.serial0, c.serial1)
		}
		left := "-"
		if c.left > 0 {
			left = ms(c.left) + " after its last heartbeat"
		}
		fmt.Printf("%-20s %12.3f %18.0f %22s %7.0f MB   %s\n", name, c.cores, c.reloads, same, mb(c.rss), left)
	}
	fmt.Printf("(CPU over %v from /proc/PID/stat; the window holds the default refresh of 30s, so one full reload by the poll)\n\n", scaleWindow)
}

func reportScale(b *testing.B, q scaleQPS, lats []scaleLatency, cpus []scaleCPU) {
	pg := q.median("cluster A", "pgcluster")
	b.ReportMetric(pg, "cluster-qps")
	b.ReportMetric(pg/q.median("cluster A", "file"), "cluster-x-file")
	b.ReportMetric(pg/q.median("cluster A", "whoami"), "cluster-x-whoami")
	b.ReportMetric(median(q.storm["followed"])/median(q.storm["copy"]), "storm-x-copy")
	for _, l := range lats {
		b.ReportMetric(float64(percentile(l.lat, 99).Microseconds())/1000, fmt.Sprintf("p99-ms-%dn", l.shape.nodes))
		b.ReportMetric(mb(l.rssChanged), fmt.Sprintf("rss-MB-%dn", l.shape.nodes))
	}
	for _, c := range cpus {
		unit := "heartbeat-cores"
		if c.staleAfter != "" {
			unit = "heartbeat-cores-stale"
		}
		b.ReportMetric(c.cores, unit)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func mb(bytes int64) float64 { return float64(bytes) / (1 << 20) }

// thousands writes n with commas: 10000 is 10,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
