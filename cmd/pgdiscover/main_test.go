package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

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

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"a", "b"},
		{"-probe", "icmp", "x.lan"},
		{"-port", "70000", "x.lan"},
		{"-dns", ":53", "x.lan"},
		{"-timeout", "0s", "x.lan"},
	} {
		var o, e bytes.Buffer
		if code := run(t.Context(), args, &o, &e); code != 2 {
			t.Errorf("%q: exit %d, want 2; stderr %s", args, code, e.String())
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
