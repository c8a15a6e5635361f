// Package deploy tests the ways pgcluster ships: a CoreDNS built through
// plugin.cfg, the container image, the Kubernetes manifests and the systemd
// unit in this directory. It holds tests only.
package deploy

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/proc"
)

// Zone is the zone every Corefile of deploy/ serves.
const Zone = "pgcluster.lan."

// Limits of the tests' waits.
const (
	// readyTimeout bounds the wait for an instance's first expected answer.
	readyTimeout = 60 * time.Second
	// stopTimeout bounds the wait for an instance to exit after SIGTERM.
	stopTimeout = 15 * time.Second
	// starts is how many times runCoreDNS tries fresh ports when the
	// instance exits because another process took one.
	starts = 3
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
type ports struct {
	DNS, Health, Ready, Metrics int
}

// freePorts picks four distinct loopback ports, the DNS one free for both
// TCP and UDP.
func freePorts() (ports, error) {
	var p ports
	seen := map[int]bool{}
	for _, dst := range []*int{&p.DNS, &p.Health, &p.Ready, &p.Metrics} {
		for {
			port, err := proc.FreeDNSPort()
			if err != nil {
				return p, err
			}
			if !seen[port] {
				seen[port] = true
				*dst = port
				break
			}
		}
	}
	return p, nil
}

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
type instance struct {
	ports
	p   *proc.Process
	log *proc.Buffer
}

// runCoreDNS starts the command mk returns for free loopback ports and waits
// until it answers the SOA of Zone over UDP. An instance that exits because a
// port was taken in the meantime is started again with other ports. When the
// test ends the instance is stopped, its log shown if the test failed.
func runCoreDNS(t testing.TB, mk func(p ports) (*exec.Cmd, error)) *instance {
	t.Helper()
	for try := 1; ; try++ {
		in := startCoreDNS(t, mk)
		err := in.wait(readyTimeout, in.soa)
		if err == nil {
			return in
		}
		if in.p.Exited() && strings.Contains(in.log.String(), "address already in use") && try < starts {
			continue
		}
		t.Fatalf("coredns on port %d: %v\nits log:\n%s", in.DNS, err, in.log)
	}
}

// startCoreDNS starts the command mk returns for free loopback ports,
// without waiting for it to answer.
func startCoreDNS(t testing.TB, mk func(p ports) (*exec.Cmd, error)) *instance {
	t.Helper()
	p, err := freePorts()
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := mk(p)
	if err != nil {
		t.Fatal(err)
	}
	in := &instance{ports: p, log: &proc.Buffer{}}
	cmd.Stdout, cmd.Stderr = in.log, in.log
	if in.p, err = proc.Start(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.p.Stop(stopTimeout); err != nil {
			t.Errorf("coredns on port %d: %v", in.DNS, err)
		}
		if t.Failed() {
			t.Logf("coredns on port %d (%s); its log:\n%s", in.DNS, in.p.State(), in.log)
		}
	})
	return in
}

// wait polls cond until it returns nil, failing after timeout or as soon as
// the process exits.
func (in *instance) wait(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if in.p.Exited() {
			return fmt.Errorf("exited (%s): %w", in.p.State(), err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// addr returns the instance's DNS address.
func (in *instance) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(in.DNS)) }

// soa asks for the SOA of Zone over UDP.
func (in *instance) soa() error {
	r, err := query(in.addr(), Zone, dns.TypeSOA)
	if err != nil {
		return err
	}
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		return fmt.Errorf("SOA %s: %s with %d answers", Zone, dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	return nil
}

// waitAddrs waits until name's A records are exactly want, failing the test
// with the last answer after readyTimeout.
func (in *instance) waitAddrs(t testing.TB, name string, want ...string) {
	t.Helper()
	slices.Sort(want)
	var got []string
	err := in.wait(readyTimeout, func() error {
		r, err := query(in.addr(), name, dns.TypeA)
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
		t.Fatalf("coredns on port %d: %v\nits log:\n%s", in.DNS, err, in.log)
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
	err := in.wait(readyTimeout, func() error {
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
		t.Fatalf("coredns on port %d: %v\nits log:\n%s", in.DNS, err, in.log)
	}
}

// query sends one query over UDP.
func query(addr, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Net: "udp", Timeout: 500 * time.Millisecond}
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

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// coreDNSBinary builds cmd/coredns once per test run, statically as make
// image does, into a directory removed by TestMain. With make image's
// compile flags (CGO_ENABLED=0, -trimpath; its -ldflags only change the
// link) the packages compiled for one are in the build cache for the
// other: the deployment tests compile CoreDNS once, not twice.
func coreDNSBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pgcluster-deploy-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "coredns")
		cmd := exec.Command("go", "build", "-trimpath", "-o", binPath, "./cmd/coredns")
		cmd.Dir = mustAbs("..")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build ./cmd/coredns: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		panic(err)
	}
	return a
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}
