package test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
)

// TestDiscoverWatch runs the real pgdiscover -watch against the real plugin
// with a TTL of 1 s: a node removed from the registry (deleted, or marked
// unhealthy) prints its "-" line within TTL + 1 s of the COMMIT, a node
// added (inserted, or healthy again) its "+" line, and nothing else is
// printed.
func TestDiscoverWatch(t *testing.T) {
	// Build while PostgreSQL starts.
	bin := filepath.Join(t.TempDir(), "pgdiscover")
	var build sync.WaitGroup
	var buildOut []byte
	var buildErr error
	build.Go(func() {
		buildOut, buildErr = exec.Command("go", "build", "-o", bin, "../cmd/pgdiscover").CombinedOutput()
	})
	reg := Registry(t)
	nodes := startNodes(t, 3)
	register(t, reg, nodes[:2]...) // n3 joins later
	s := StartCoreDNS(t, Corefile(reg.DSN(""), "allow_loopback", "ttl 1"))
	build.Wait()
	if buildErr != nil {
		t.Fatalf("go build ./cmd/pgdiscover: %v\n%s", buildErr, buildOut)
	}

	w := discoverytest.StartLines(t, exec.Command(bin, "-dns", s.UDP, "-watch", "prod.pgcluster.lan"))
	next := func(timeout time.Duration, awaiting string) string {
		t.Helper()
		l, err := w.Next(timeout, awaiting)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	var serving []string
	for _, n := range nodes[:2] {
		serving = append(serving, n.addr())
	}
	if first := next(10*time.Second, "first line"); !slices.Contains(serving, first) {
		t.Fatalf("first line %q, want the chosen node, one of %v", first, serving)
	}

	const ttl = time.Second
	steps := []struct {
		what, sql, line string
	}{
		{"n2 deleted", "DELETE FROM pgcluster_nodes WHERE name = 'n2'", "- " + nodes[1].addr()},
		{"n3 inserted", fmt.Sprintf("INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES ('local', 'n3', '127.0.0.1', %d, 'standby')", nodes[2].pg.Port), "+ " + nodes[2].addr()},
		{"n3 unhealthy", "UPDATE pgcluster_nodes SET healthy = false WHERE name = 'n3'", "- " + nodes[2].addr()},
		{"n3 healthy", "UPDATE pgcluster_nodes SET healthy = true WHERE name = 'n3'", "+ " + nodes[2].addr()},
	}
	var lat []time.Duration
	for _, st := range steps {
		reg.MustExec(t, st.sql)
		committed := time.Now()
		got := next(10*time.Second, fmt.Sprintf("%q after %s", st.line, st.what))
		took := time.Since(committed)
		if got != st.line {
			t.Fatalf("after %s: printed %q, want %q", st.what, got, st.line)
		}
		t.Logf("%s: %q printed %v after COMMIT (TTL %v)", st.what, got, took.Round(time.Millisecond), ttl)
		if took > ttl+time.Second {
			t.Errorf("%s: %q printed %v after COMMIT, want within TTL + 1s", st.what, got, took)
		}
		lat = append(lat, took)
	}
	t.Logf("COMMIT -> line over %d changes: max %v", len(lat), slices.Max(lat).Round(time.Millisecond))

	rest, err := w.Stop()
	for _, l := range rest {
		t.Errorf("unexpected line %q", l)
	}
	if err != nil {
		t.Errorf("pgdiscover -watch after SIGINT: %v; stderr: %s", err, w.Stderr())
	}
}
