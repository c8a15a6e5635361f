package test

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
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

	cmd := exec.Command(bin, "-dns", s.UDP, "-watch", "prod.pgcluster.lan")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := false
	t.Cleanup(func() {
		if !waited {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	// next returns the next line, failing the test after timeout.
	next := func(timeout time.Duration, waitingFor string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Wait()
				waited = true
				t.Fatalf("pgdiscover ended while waiting for %s; stderr: %s", waitingFor, stderr.String())
			}
			return l
		case <-time.After(timeout):
			t.Fatalf("no %s within %v", waitingFor, timeout)
		}
		return ""
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

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	for l := range lines {
		t.Errorf("unexpected line %q", l)
	}
	err = cmd.Wait()
	waited = true
	if err != nil {
		t.Errorf("pgdiscover -watch after SIGINT: %v; stderr: %s", err, stderr.String())
	}
}
