// Package deploy tests the ways pgcluster ships: a CoreDNS built through
// plugin.cfg, the container image, the Kubernetes manifests and the systemd
// unit in this directory. It holds tests only.
package deploy

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// Zone is the zone every Corefile of deploy/ serves.
const Zone = "pgcluster.lan."

// Limits of the tests' waits.
const (
	// readyTimeout bounds the wait for an instance's first expected answer.
	readyTimeout = 60 * time.Second
	// stopTimeout bounds the wait for an instance to exit after SIGTERM.
	stopTimeout = 15 * time.Second
	// queryTimeout bounds one query to an instance.
	queryTimeout = 500 * time.Millisecond
)

// testNode is the node every test registry holds: a documentation address
// (192.0.2.0/24), never loopback, so that the Corefiles of deploy/ advertise
// it without allow_loopback.
const (
	testNode     = "pg1"
	testNodeAddr = "192.0.2.10"
)

// repoRoot returns the checkout's root directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("checkout root %s: %v", root, err)
	}
	return root
}

// registry starts a PostgreSQL server with the registry schema and one
// primary, testNode at testNodeAddr, in cluster local.
func registry(t testing.TB, opts ...pgtest.Options) *pgtest.Postgres {
	t.Helper()
	pg := pgtest.New(t, opts...)
	pg.MustExec(t, pgcluster.Schema)
	pg.MustExec(t, "INSERT INTO pgcluster_nodes (name, address, role) VALUES ($1, $2, 'primary')", testNode, testNodeAddr)
	return pg
}

// ports are the loopback ports one CoreDNS instance listens on.
type ports = coretest.Ports

// The listeners of the Corefiles in deploy/ that localize moves to loopback.
var (
	serverKey = regexp.MustCompile(`(?m)^(\S+):1053 \{$`)
	endpoints = map[string]*regexp.Regexp{
		"health":     regexp.MustCompile(`(?m)^(\s*health) :8080\b`),
		"ready":      regexp.MustCompile(`(?m)^(\s*ready) :8181\b`),
		"prometheus": regexp.MustCompile(`(?m)^(\s*prometheus) :9153\b`),
	}
)

// localize returns corefile, a Corefile of deploy/ serving port 1053 with
// health on :8080, ready on :8181 and prometheus on :9153, with those
// listeners moved to p's loopback ports, and nothing else changed.
func localize(corefile string, p ports) (string, error) {
	if n := len(serverKey.FindAllString(corefile, -1)); n != 1 {
		return "", fmt.Errorf("want one server block on port 1053, found %d", n)
	}
	out := serverKey.ReplaceAllString(corefile, fmt.Sprintf("${1}:%d {\n    bind 127.0.0.1", p.DNS))
	for name, port := range map[string]int{"health": p.Health, "ready": p.Ready, "prometheus": p.Metrics} {
		re := endpoints[name]
		if n := len(re.FindAllString(out, -1)); n != 1 {
			return "", fmt.Errorf("want one %s line on its default port, found %d", name, n)
		}
		out = re.ReplaceAllString(out, fmt.Sprintf("${1} 127.0.0.1:%d", port))
	}
	return out, nil
}

// instance is one CoreDNS process started by a test.
type instance struct{ *coretest.Instance }

// runCoreDNS starts the command mk returns for free loopback ports and waits
// until it answers the SOA of Zone over UDP. An instance that exits because a
// port was taken in the meantime is started again with other ports. When the
// test ends the instance is stopped, its log shown if the test failed.
func runCoreDNS(t testing.TB, mk func(p ports) (*exec.Cmd, error)) *instance {
	t.Helper()
	return &instance{coretest.Start(t, coreDNSConfig(mk))}
}

// startCoreDNS starts the command mk returns for free loopback ports,
// without waiting for it to answer.
func startCoreDNS(t testing.TB, mk func(p ports) (*exec.Cmd, error)) *instance {
	t.Helper()
	return &instance{coretest.StartNoWait(t, coreDNSConfig(mk))}
}

// coreDNSConfig is how the tests start the command mk returns.
func coreDNSConfig(mk func(p ports) (*exec.Cmd, error)) coretest.Config {
	return coretest.Config{
		Command:      mk,
		Ready:        coretest.SOA(Zone, queryTimeout),
		ReadyTimeout: readyTimeout,
		StopTimeout:  stopTimeout,
	}
}

// waitAddrs waits until name's A records are exactly want, failing the test
// with the last answer after readyTimeout.
func (in *instance) waitAddrs(t testing.TB, name string, want ...string) {
	t.Helper()
	slices.Sort(want)
	var got []string
	err := in.Wait(readyTimeout, func() error {
		r, err := query(in.Addr(), name, dns.TypeA)
		if err != nil {
			return err
		}
		got = got[:0]
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				got = append(got, a.A.String())
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Errorf("A %s: %s with %v, want %v", name, dns.RcodeToString[r.Rcode], got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("coredns on port %d: %v\nits log:\n%s", in.DNS, err, in.Log())
	}
}

// get returns the status code and body of an HTTP GET on one of the
// instance's loopback ports.
func (in *instance) get(port int, path string) (int, string, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(port) + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String(), err
}

// waitHTTP waits until GET path on port answers 200 with a body containing
// want, failing the test after readyTimeout.
func (in *instance) waitHTTP(t testing.TB, port int, path, want string) {
	t.Helper()
	err := in.Wait(readyTimeout, func() error {
		code, body, err := in.get(port, path)
		if err != nil {
			return err
		}
		if code != http.StatusOK || !strings.Contains(body, want) {
			if len(body) > 300 {
				body = body[:300] + "…"
			}
			return fmt.Errorf("GET %s: %d, want 200 with %q; body: %s", path, code, want, body)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("coredns on port %d: %v\nits log:\n%s", in.DNS, err, in.Log())
	}
}

// query sends one query over UDP.
func query(addr, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Net: "udp", Timeout: queryTimeout}
	r, _, err := c.Exchange(m, addr)
	return r, err
}

// run runs a command in dir and returns its combined output, failing the
// test with that output when the command fails. It logs how long it took.
func run(t testing.TB, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = env
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s (in %s): %v\n%s", name, strings.Join(args, " "), dir, err, out)
	}
	t.Logf("%s %s: %.1fs", name, strings.Join(args, " "), time.Since(start).Seconds())
	return string(out)
}

// coreDNSBuild is cmd/coredns, built once per test run, statically as make
// image does, and removed by TestMain. With make image's compile flags
// (CGO_ENABLED=0, -trimpath; its -ldflags only change the link) the
// packages compiled for one are in the build cache for the other: the
// deployment tests compile CoreDNS once, not twice.
var coreDNSBuild = coretest.Build{Flags: []string{"-trimpath"}, Env: []string{"CGO_ENABLED=0"}}

func TestMain(m *testing.M) {
	code := m.Run()
	coreDNSBuild.Remove()
	os.Exit(code)
}
