package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// The tests start real bin/coredns instances (cmd/coredns built once per
// run), a real PostgreSQL (internal/pgtest) and a real redis-server
// (internal/redistest), all on loopback and free ports.

const zone = "pgcluster.lan."

// Limits of the tests' waits.
const (
	readyTimeout  = 30 * time.Second
	settleTimeout = 30 * time.Second
	stopTimeout   = 15 * time.Second
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
)

// coreDNSBinary builds cmd/coredns once per test run, as make build does,
// into a directory TestMain removes.
func coreDNSBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "pgclusterctl-test-bin-"); buildErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-o", filepath.Join(binDir, "coredns"), "../coredns").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/coredns: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return filepath.Join(binDir, "coredns")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// instance is a bin/coredns process started by a test.
type instance struct {
	dns     string // host:port
	metrics string // host:port of the prometheus plugin
	p       *proc.Process
	log     *proc.Buffer
}

// startInstance runs bin/coredns with a Corefile serving zone with the
// pgcluster options given, on free loopback ports, and returns once it
// answers the zone's SOA. It is stopped when the test ends, its log shown
// if the test failed.
func startInstance(t testing.TB, options ...string) *instance {
	t.Helper()
	dnsPort, err := proc.FreeDNSPort()
	if err != nil {
		t.Fatal(err)
	}
	metricsPort, err := proc.FreeDNSPort()
	if err != nil {
		t.Fatal(err)
	}
	in := &instance{
		dns:     net.JoinHostPort("127.0.0.1", strconv.Itoa(dnsPort)),
		metrics: net.JoinHostPort("127.0.0.1", strconv.Itoa(metricsPort)),
		log:     &proc.Buffer{},
	}
	conf := filepath.Join(t.TempDir(), "Corefile")
	corefile := fmt.Sprintf("%s:%d {\n    bind 127.0.0.1\n    errors\n    prometheus %s\n    pgcluster {\n        %s\n    }\n}\n",
		zone, dnsPort, in.metrics, strings.Join(options, "\n        "))
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(coreDNSBinary(t), "-conf", conf)
	cmd.Stdout, cmd.Stderr = in.log, in.log
	if in.p, err = proc.Start(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.p.Stop(stopTimeout); err != nil {
			t.Errorf("coredns on %s: %v", in.dns, err)
		}
		if t.Failed() {
			t.Logf("coredns on %s; its log:\n%s", in.dns, in.log)
		}
	})
	deadline := time.Now().Add(readyTimeout)
	for {
		r, err := query(in.dns, zone, dns.TypeSOA)
		if err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0 {
			return in
		}
		if in.p.Exited() || time.Now().After(deadline) {
			t.Fatalf("coredns on %s does not answer the SOA of %s (%s): %v\nits log:\n%s", in.dns, zone, in.p.State(), err, in.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// txt returns the TXT strings of name as key=value pairs.
func (in *instance) txt(t testing.TB, name string) map[string]string {
	t.Helper()
	r, err := query(in.dns, name, dns.TypeTXT)
	if err != nil {
		t.Fatalf("TXT %s: %v", name, err)
	}
	out := map[string]string{}
	for _, rr := range r.Answer {
		if tx, ok := rr.(*dns.TXT); ok {
			for _, s := range tx.Txt {
				k, v, _ := strings.Cut(s, "=")
				out[k] = v
			}
		}
	}
	return out
}

// metric returns the value of the series of the instance's /metrics whose
// line starts with prefix (name and labels), and whether there is one.
func (in *instance) metric(t testing.TB, prefix string) (string, bool) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + in.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			return strings.TrimSpace(rest[strings.LastIndexByte(rest, ' ')+1:]), true
		}
	}
	return "", false
}

func query(addr, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Timeout: 500 * time.Millisecond}
	r, _, err := c.Exchange(m, addr)
	return r, err
}

// backend is a node that accepts TCP connections (check tcp), on an address
// of its own, and can be stopped.
type backend struct {
	host string
	port int
	l    net.Listener
}

func newBackend(t testing.TB, host string) *backend {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{host: host, port: l.Addr().(*net.TCPAddr).Port, l: l}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	t.Cleanup(b.stop)
	return b
}

// stop closes the listener: probes are refused from now on.
func (b *backend) stop() { b.l.Close() }

// freePort returns a loopback port nothing listens on.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// status runs pgclusterctl status with args and returns its exit status,
// standard output and standard error.
func status(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut strings.Builder
	code := run(context.Background(), append([]string{"status"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}
