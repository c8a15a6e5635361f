package test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// registryUp is the registry_up sample of Zone.
var registryUp = fleetMetric("coredns_pgcluster_registry_up")

// securityCorefile is a fleet Corefile (see StartFleetInstance) serving
// Zone from the registry at dsn, quoted (a key=value DSN has spaces), with
// metrics and extra pgcluster options.
func securityCorefile(dsn string, extra ...string) string {
	opts := append([]string{fmt.Sprintf("postgres %q", dsn), "allow_loopback"}, extra...)
	return fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n prometheus 127.0.0.1:%s\n pgcluster {\n  %s\n }\n}\n",
		Zone, PortPlaceholder, MetricsPlaceholder, strings.Join(opts, "\n  "))
}

// waitLogged waits until the instance's log holds every part on one line,
// and returns that line.
func waitLogged(t testing.TB, in *Instance, timeout time.Duration, parts ...string) string {
	t.Helper()
	var found string
	Eventually(t, timeout, func() error {
		for l := range strings.SplitSeq(in.Log(), "\n") {
			if containsAll(l, parts) {
				found = l
				return nil
			}
		}
		return fmt.Errorf("no log line of %s holds all of %q", in.Addr(), parts)
	})
	return found
}

func containsAll(s string, parts []string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

// metricIs checks that the instance's sample name has value want.
func metricIs(t testing.TB, in *Instance, name string, want float64) func() error {
	return func() error {
		if got := metric(t, in, name); got != want {
			return fmt.Errorf("%s on %s is %v, want %v", name, in.Addr(), got, want)
		}
		return nil
	}
}

// holdsFor checks cond every 20 ms for d, failing the test at the first
// error: what must not happen during a window (an answer that must not
// change while something is refused).
func holdsFor(t testing.TB, d time.Duration, what string, cond func() error) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if err := cond(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// soaRcode returns the rcode of the instance's answer to the SOA of Zone.
func soaRcode(in *Instance) (int, error) {
	m, err := Exchange("udp", in.Addr(), Zone, dns.TypeSOA)
	if err != nil {
		return 0, err
	}
	return m.Rcode, nil
}

// answersOf checks that the instance answers local.<Zone> with exactly
// hosts.
func answersOf(in *Instance, hosts ...string) func() error {
	return answersExactly([]*Instance{in}, slices.Clone(hosts))
}

// pgQueryRow runs one query as postgres on pg's database postgres, over a
// connection of its own, and scans its row.
func pgQueryRow(ctx context.Context, pg *pgtest.Postgres, sql string, dest ...any) error {
	conn, err := pgx.Connect(ctx, pg.DSN(""))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dest...)
}
