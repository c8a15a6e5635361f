package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/coretest"
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
	// queryTimeout bounds one query to an instance.
	queryTimeout = 500 * time.Millisecond
)

// coreDNSBuild is cmd/coredns, built once per test run as make build does;
// TestMain removes it.
var coreDNSBuild coretest.Build

func TestMain(m *testing.M) {
	code := m.Run()
	coreDNSBuild.Remove()
	os.Exit(code)
}

// instance is a bin/coredns process started by a test.
type instance struct{ *coretest.Instance }

// startInstance runs bin/coredns with a Corefile serving zone with the
// pgcluster options given, on free loopback ports, and returns once it
// answers the zone's SOA. It is stopped when the test ends, its log shown
// if the test failed.
func startInstance(t testing.TB, options ...string) *instance {
	t.Helper()
	corefile := fmt.Sprintf("%s:%s {\n    bind 127.0.0.1\n    errors\n    prometheus 127.0.0.1:%s\n    pgcluster {\n        %s\n    }\n}\n",
		zone, coretest.PortPlaceholder, coretest.MetricsPlaceholder, strings.Join(options, "\n        "))
	return &instance{coretest.Start(t, coretest.Config{
		Binary:       coreDNSBuild.Binary(t),
		Corefile:     corefile,
		Ready:        coretest.SOA(zone, queryTimeout),
		ReadyTimeout: readyTimeout,
		StopTimeout:  stopTimeout,
	})}
}

// txt returns the TXT strings of name as key=value pairs.
func (in *instance) txt(t testing.TB, name string) map[string]string {
	t.Helper()
	r, err := query(in.Addr(), name, dns.TypeTXT)
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
	v, ok, err := in.Metric(prefix)
	if err != nil {
		t.Fatal(err)
	}
	return v, ok
}

func query(addr, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Timeout: queryTimeout}
	r, _, err := c.Exchange(m, addr)
	return r, err
}

// backend is a node that accepts TCP connections (check tcp), on an address
// of its own, and can be stopped.
type backend struct {
	*coretest.Backend
	host string
	port int
}

func newBackend(t testing.TB, host string) *backend {
	t.Helper()
	b := coretest.NewBackend(t, host)
	return &backend{Backend: b, host: b.Host, port: b.Port}
}

// stop closes the listener: probes are refused from now on.
func (b *backend) stop() { b.Close() }

// status runs pgclusterctl status with args and returns its exit status,
// standard output and standard error.
func status(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut strings.Builder
	code := run(context.Background(), append([]string{"status"}, args...), &out, &errOut)
	return code, out.String(), errOut.String()
}
