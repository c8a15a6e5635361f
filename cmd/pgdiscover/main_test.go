package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/discovery"
	"github.com/pgcluster/pgcluster/discovery/discoverytest"
)

const zone = "pgcluster.lan"

// binary is pgdiscover built for these tests.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgdiscover-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "pgdiscover")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "go build: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// cluster publishes stand-in PostgreSQL nodes behind proxies adding the
// given delays, as cluster "local" with the alias "prod".
func cluster(t *testing.T, delays ...time.Duration) (*discoverytest.Server, []discoverytest.Node) {
	t.Helper()
	s := discoverytest.NewServer(t, zone)
	var nodes []discoverytest.Node
	for i, d := range delays {
		pg := discoverytest.NewPostgres(t)
		addr := pg.Addr
		if d > 0 {
			addr = discoverytest.NewProxy(t, pg.Addr.String(), d).Addr
		}
		nodes = append(nodes, discoverytest.Node{Name: fmt.Sprintf("n%d", i+1), Addr: addr})
	}
	s.SetCluster("local", nodes...)
	s.SetAlias("prod", "local")
	return s, nodes
}

// pgdiscover runs the binary to completion.
func pgdiscover(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return o.String(), e.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run pgdiscover: %v", err)
	}
	return o.String(), e.String(), 0
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// Three nodes whose first reply is 2, 15 and 8 ms away: the 2 ms one is
// printed in 20 runs of 20 on a quiet machine.
func TestPicksFastest(t *testing.T) {
	s, nodes := cluster(t, 2*time.Millisecond, 15*time.Millisecond, 8*time.Millisecond)
	const runs = 20
	wins := 0
	var took []time.Duration
	for range runs {
		start := time.Now()
		out, errOut, code := pgdiscover(t, "-dns", s.Addr, "-v", "prod.pgcluster.lan")
		took = append(took, time.Since(start))
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errOut)
		}
		if firstLine(out) == nodes[0].Addr.String() {
			wins++
		} else {
			t.Logf("picked another node:\n%s", out)
		}
	}
	slices.Sort(took)
	t.Logf("the 2 ms node was picked in %d runs of %d; each run (process start, resolve, probe) p50 %s max %s",
		wins, runs, took[runs/2].Round(time.Millisecond/10), took[runs-1].Round(time.Millisecond/10))
	// The goal is 20 of 20, measured on a quiet machine (go test -v -run
	// PicksFastest); the proxies that add the delays share this process, so
	// under the load of a parallel test run they stall with it. Assert only
	// what a random or wrong ranking would miss.
	if wins < runs*3/4 {
		t.Errorf("the 2 ms node was picked in %d runs of %d", wins, runs)
	}
}

// A node that never answers costs one probe timeout, whatever their number.
func TestSilentNodesCostOneTimeout(t *testing.T) {
	s, nodes := cluster(t, 0)
	for i := range 3 {
		nodes = append(nodes, discoverytest.Node{Name: fmt.Sprintf("hung%d", i), Addr: discoverytest.NewSilent(t).Addr})
	}
	s.SetCluster("local", nodes...)
	start := time.Now()
	out, errOut, code := pgdiscover(t, "-dns", s.Addr, "-timeout", "500ms", "-v", "local.pgcluster.lan")
	elapsed := time.Since(start)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	t.Logf("3 silent nodes of 4, probe timeout 500ms: %s\n%s", elapsed, out)
	if firstLine(out) != nodes[0].Addr.String() {
		t.Errorf("chose %q, want %s", firstLine(out), nodes[0].Addr)
	}
	if got := strings.Count(out, "\n"); got != 5 {
		t.Errorf("%d lines with -v, want the choice and 4 candidates", got)
	}
	if strings.Count(out, "unreachable") != 3 {
		t.Errorf("want 3 unreachable candidates:\n%s", out)
	}
	if elapsed > 3*time.Second {
		t.Errorf("took %s: silent nodes were not probed in parallel", elapsed)
	}
}

func TestNothingReachable(t *testing.T) {
	s := discoverytest.NewServer(t, zone)
	dead := discoverytest.NewPostgres(t)
	dead.Close()
	s.SetCluster("local", discoverytest.Node{Name: "n1", Addr: dead.Addr})
	out, errOut, code := pgdiscover(t, "-dns", s.Addr, "local.pgcluster.lan")
	if code == 0 || out != "" {
		t.Fatalf("exit %d, stdout %q; want a failure and nothing on stdout", code, out)
	}
	if !strings.Contains(errOut, "no candidate reachable") || !strings.Contains(errOut, dead.Addr.String()) {
		t.Errorf("stderr %q does not say what failed", errOut)
	}
	_, errOut, code = pgdiscover(t, "-dns", s.Addr, "nothing.pgcluster.lan")
	if code == 0 || !strings.Contains(errOut, "no address") {
		t.Errorf("unknown name: exit %d, stderr %q", code, errOut)
	}
}

func TestDNSFailover(t *testing.T) {
	s, nodes := cluster(t, 0)
	down := discoverytest.NewServer(t, zone)
	down.Stop()
	out, errOut, code := pgdiscover(t, "-dns", down.Addr+","+s.Addr, "local.pgcluster.lan")
	if code != 0 || firstLine(out) != nodes[0].Addr.String() {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func TestFixedPort(t *testing.T) {
	lns := discoverytest.ListenSamePort(t, "127.0.0.2", "127.0.0.3")
	for _, ln := range lns {
		discoverytest.ServePostgres(t, ln)
	}
	port := lns[0].Addr().String()[len("127.0.0.2:"):]
	s := discoverytest.NewServer(t, zone)
	s.SetRecords("plain 30 IN A 127.0.0.2", "plain 30 IN A 127.0.0.3")
	out, errOut, code := pgdiscover(t, "-dns", s.Addr, "-port", port, "-probe", "tcp", "-v", "plain.pgcluster.lan")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if first := firstLine(out); first != "127.0.0.2:"+port && first != "127.0.0.3:"+port {
		t.Errorf("chose %q", first)
	}
}

func TestJSON(t *testing.T) {
	s, nodes := cluster(t, 0, 0)
	out, errOut, code := pgdiscover(t, "-dns", s.Addr, "-json", "prod.pgcluster.lan")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var r jsonResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if r.Chosen == "" || len(r.Candidates) != 2 || r.Canonical != "local.pgcluster.lan." || !r.SRV || r.TTL != 30 {
		t.Errorf("result %+v", r)
	}
	if r.Candidates[0].LatencyMS == nil || r.Candidates[0].Addr != r.Chosen {
		t.Errorf("first candidate %+v is not the chosen one", r.Candidates[0])
	}
	if r.Chosen != nodes[0].Addr.String() && r.Chosen != nodes[1].Addr.String() {
		t.Errorf("chose %s, not a node", r.Chosen)
	}
}

// noClient makes building a discovery client fail the test: a usage error
// must stop pgdiscover before any client, and so any DNS query, exists.
func noClient(t *testing.T) {
	t.Helper()
	saved := newClient
	newClient = func(cfg discovery.Config) (*discovery.Client, error) {
		t.Errorf("a client was built (servers %q): a query could go out", cfg.Servers)
		return saved(cfg)
	}
	t.Cleanup(func() { newClient = saved })
}

// Usage errors exit 2 with a message saying what is wrong, before any
// query. Every case names a loopback DNS server, or none only where -dns
// itself is the error.
func TestUsage(t *testing.T) {
	noClient(t)
	const dns = "127.0.0.1:1"
	long := strings.Repeat("a", 70)
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"-dns", dns}, "want exactly one NAME"},
		{[]string{"-dns", dns, "a", "b"}, "want exactly one NAME"},
		{[]string{"-dns", dns, "-probe", "icmp", "x.lan"}, `unknown probe "icmp"`},
		{[]string{"-dns", dns, "-port", "70000", "x.lan"}, "-port 70000: out of range"},
		{[]string{"-dns", dns, "-timeout", "0s", "x.lan"}, "-timeout 0s: must be positive"},
		{[]string{"-dns", dns, "-max-probes", "0", "x.lan"}, "-max-probes 0: must be at least 1"},
		// -dns
		{[]string{"-dns", "", "x.lan"}, `-dns "": empty; name a DNS server`},
		{[]string{"-dns=", "x.lan"}, `-dns "": empty`},
		{[]string{"-dns", " ", "x.lan"}, `-dns " ": empty`},
		{[]string{"-dns", ":53", "x.lan"}, "no host before the port"},
		{[]string{"-dns", ":abc", "x.lan"}, `":abc": no host before the port`},
		{[]string{"-dns", "127.0.0.1:99999", "x.lan"}, `port "99999" is not a number from 1 to 65535`},
		{[]string{"-dns", "127.0.0.1:abc", "x.lan"}, `port "abc" is not a number from 1 to 65535`},
		{[]string{"-dns", dns + ",," + dns, "x.lan"}, "an empty address in the list"},
		// -interval
		{[]string{"-dns", dns, "-watch", "-interval", "1ns", "x.lan"}, "-interval 1ns: below the floor of 100ms"},
		{[]string{"-dns", dns, "-interval", "99ms", "x.lan"}, "-interval 99ms: below the floor of 100ms"},
		{[]string{"-dns", dns, "-interval", "-1s", "x.lan"}, "below the floor"},
		// NAME
		{[]string{"-dns", dns, long + ".pgcluster.lan"}, "is 70 bytes long, the most is 63"},
		{[]string{"-dns", dns, strings.Repeat("abcdefghi.", 26)}, "259 bytes long, the most is 253"},
		{[]string{"-dns", dns, "local..pgcluster.lan"}, "empty label"},
		{[]string{"-dns", dns, "local.pgcluster.lan:5433"}, "has a port: give the name alone and the port with -port (pgdiscover -port 5433 local.pgcluster.lan)"},
		{[]string{"-dns", dns, "[::1]:5432"}, "has a port"},
		{[]string{"-dns", dns, "local pgcluster.lan"}, "character ' ' is not allowed"},
	}
	for _, tc := range tests {
		var o, e bytes.Buffer
		code := run(t.Context(), tc.args, &o, &e)
		if code != 2 || o.Len() != 0 || !strings.Contains(e.String(), tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 saying %q", tc.args, code, o.String(), e.String(), tc.want)
		}
	}
}

// -interval below the floor exits at once, without a query; at the floor,
// -watch asks the server about ten times a second at most, not thousands.
func TestWatchIntervalFloor(t *testing.T) {
	s, _ := cluster(t, 0)
	s.SetTTL(3600)
	start := time.Now()
	_, errOut, code := pgdiscover(t, "-dns", s.Addr, "-watch", "-interval", "1ns", "local.pgcluster.lan")
	if code != 2 || s.Queries() != 0 {
		t.Fatalf("-interval 1ns: exit %d after %s, %d queries, stderr %q; want exit 2 and no query", code, time.Since(start), s.Queries(), errOut)
	}

	w := discoverytest.StartLines(t, exec.Command(binary, "-dns", s.Addr, "-watch", "-interval", "100ms", "local.pgcluster.lan"))
	if _, err := w.Next(15*time.Second, "first line"); err != nil {
		t.Fatal(err)
	}
	before, start := s.Queries(), time.Now()
	time.Sleep(2 * time.Second) // the window the rate is measured over, not a wait for a condition
	n := s.Queries() - before
	rate := float64(n) / time.Since(start).Seconds()
	t.Logf("-watch -interval 100ms: %d queries in %s (%.0f/s)", n, time.Since(start).Round(time.Millisecond), rate)
	// Each resolution asks A, AAAA and SRV of the name and of primary.NAME.
	if rate > 10*6+10 {
		t.Errorf("%.0f queries per second with -interval 100ms", rate)
	}
	if _, err := w.Stop(); err != nil {
		t.Errorf("pgdiscover -watch after SIGINT: %v; stderr: %s", err, w.Stderr())
	}
}

// A name that does not exist says NXDOMAIN; one that exists without an
// address says so.
func TestNoAddress(t *testing.T) {
	s, _ := cluster(t, 0)
	tests := []struct{ name, want string }{
		{"nothing.pgcluster.lan", "no address for nothing.pgcluster.lan.: no such name (NXDOMAIN)"},
		{"standby.prod.pgcluster.lan", "(alias of standby.local.pgcluster.lan.): name exists but has no address"},
	}
	for _, tc := range tests {
		out, errOut, code := pgdiscover(t, "-dns", s.Addr, tc.name)
		if code != 1 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 1 saying %q", tc.name, code, out, errOut, tc.want)
		}
	}
}

// A 3,000-node cluster: a few DNS queries, at most -max-probes probes, and
// an error line of a few hundred bytes.
func TestBigCluster(t *testing.T) {
	s := discoverytest.NewServer(t, zone)
	nodes := make([]discoverytest.Node, 3000)
	for i := range nodes {
		ip := netip.AddrFrom4([4]byte{127, 1, byte(i >> 8), byte(i)})
		nodes[i] = discoverytest.Node{Name: fmt.Sprintf("n%d", i), Addr: netip.AddrPortFrom(ip, 1)} // nothing listens
	}
	s.SetCluster("local", nodes...)
	for _, tc := range []struct {
		args       []string
		maxQueries int64
		note       string
	}{
		{[]string{"-probe", "tcp", "-v"}, 5, "probed the first 32 of "},
		{[]string{"-probe", "tcp", "-v", "-max-probes", "5"}, 5, "probed the first 5 of "},
	} {
		before := s.Queries()
		out, errOut, code := pgdiscover(t, append(append([]string{"-dns", s.Addr}, tc.args...), "local.pgcluster.lan")...)
		queries := s.Queries() - before
		longest := 0
		for l := range strings.Lines(errOut) {
			longest = max(longest, len(l))
		}
		t.Logf("%q: exit %d, %d queries, longest stderr line %d bytes:\n%s", tc.args, code, queries, longest, errOut)
		if code != 1 || out != "" {
			t.Errorf("exit %d, stdout %q; want 1 and nothing", code, out)
		}
		if queries > tc.maxQueries {
			t.Errorf("%d DNS queries, want at most %d", queries, tc.maxQueries)
		}
		if longest > 512 {
			t.Errorf("a stderr line of %d bytes", longest)
		}
		if !strings.Contains(errOut, tc.note) {
			t.Errorf("stderr does not say %q", tc.note)
		}
	}
}

// -watch: a node removed prints its "-" line within TTL + 1 s, a node added
// its "+" line.
func TestWatch(t *testing.T) {
	s, nodes := cluster(t, 0, 0, 0)
	s.SetTTL(1)
	w := discoverytest.StartLines(t, exec.Command(binary, "-dns", s.Addr, "-watch", "local.pgcluster.lan"))
	await := func(want string) time.Duration {
		t.Helper()
		start := time.Now()
		for {
			l, err := w.Next(15*time.Second, fmt.Sprintf("%q line", want))
			if err != nil {
				t.Fatal(err)
			}
			if l == want {
				return time.Since(start)
			}
		}
	}
	first, err := w.Next(15*time.Second, "first line")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first, "127.0.0.1:") {
		t.Fatalf("first line %q, want the chosen ip:port", first)
	}

	gone := nodes[2]
	s.SetCluster("local", nodes[:2]...)
	took := await("- " + gone.Addr.String())
	t.Logf("removal printed after %s (TTL 1s)", took)
	if took > 2*time.Second {
		t.Logf("slower than TTL + 1 s (loaded machine?)")
	}

	pg := discoverytest.NewPostgres(t)
	s.SetCluster("local", append(nodes[:2], discoverytest.Node{Name: "n9", Addr: pg.Addr})...)
	took = await("+ " + pg.Addr.String())
	t.Logf("addition printed after %s", took)

	if _, err := w.Stop(); err != nil {
		t.Errorf("pgdiscover -watch after SIGINT: %v; stderr: %s", err, w.Stderr())
	}
}
