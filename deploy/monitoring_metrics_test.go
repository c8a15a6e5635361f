package deploy

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/proc"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// metricsTimeout bounds the wait for a fleet to export every metric the
// monitoring files use.
const metricsTimeout = 60 * time.Second

// TestMonitoringMetricsExported starts a fleet of two bin/coredns instances
// (the static build of cmd/coredns) with check tcp and redis on a real
// registry and redis-server, makes them do what each metric counts (answers
// of each kind, a node down, fail-open answers, a skipped row, a verdict
// published by one instance and applied by the other, a registry change
// relayed by the follower to the reader), and checks that every
// metric the dashboard and the rules of deploy/monitoring/ name is exported
// by the fleet: no panel or alert names a metric that does not exist.
// TestMissingMetricsFound shows the same check failing on a fabricated
// panel.
func TestMonitoringMetricsExported(t *testing.T) {
	uses, recorded := monitoringMetrics(t)
	if len(uses) < 20 {
		t.Fatalf("only %d metric names found in deploy/monitoring/: the extraction is broken", len(uses))
	}

	// Cluster local: n1 answers TCP, n2 refuses. Cluster solo: its only node
	// refuses, so that solo.Z is answered fail-open. And a row whose name is
	// not a DNS label, skipped.
	up := listenTCP(t, "127.0.0.41")
	closed, err := proc.FreePort() // nothing listens there: connections are refused
	if err != nil {
		t.Fatal(err)
	}
	reg := pgtest.New(t)
	reg.MustExec(t, pgcluster.Schema)
	reg.MustExec(t, `INSERT INTO pgcluster_nodes (cluster, name, address, port, role) VALUES
		('local', 'n1', $1, $2, 'primary'),
		('local', 'n2', '127.0.0.42', $3, 'standby'),
		('solo', 's1', '127.0.0.43', $3, 'primary'),
		('local', 'bad_name', '127.0.0.44', 5432, 'standby')`,
		up.host, up.port, closed)
	rds := redistest.Start(t)

	bin := coreDNSBuild.Binary(t)
	dir := t.TempDir()
	var fleet []*instance
	for i := range 2 {
		fleet = append(fleet, runCoreDNS(t, func(p ports) (*exec.Cmd, error) {
			conf := filepath.Join(dir, "Corefile"+strconv.Itoa(i))
			err := os.WriteFile(conf, []byte(fmt.Sprintf(`%s:%d {
    bind 127.0.0.1
    errors
    prometheus 127.0.0.1:%d
    pgcluster {
        postgres %s
        allow_loopback
        check tcp
        interval 200ms
        timeout 100ms
        redis %s
    }
}
`, Zone, p.DNS, p.Metrics, reg.DSN(""), rds.URL())), 0o644)
			return exec.Command(bin, "-conf", conf), err
		}))
	}

	// Until every metric is there: ask what gives each kind of answer, and
	// flip n1 so that its holder publishes a new verdict, which the other
	// instance applies as it arrives (redis_propagation_seconds).
	deadline := time.Now().Add(metricsTimeout)
	flip := time.Now()
	var (
		missing []string
		ex      exported
	)
	for {
		for _, in := range fleet {
			for _, q := range []string{"local." + Zone, "solo." + Zone, "nosuchname." + Zone} {
				if _, err := query(in.Addr(), q, dns.TypeA); err != nil {
					t.Logf("query %s: %v", q, err)
				}
			}
		}
		ex = exported{}
		for _, in := range fleet {
			e, err := in.exported()
			if err != nil {
				t.Fatalf("coredns on port %d: %v\nits log:\n%s", in.DNS, err, in.Log())
			}
			ex.merge(e)
		}
		if missing = missingMetrics(uses, recorded, ex); len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v, the fleet does not export these metrics, which deploy/monitoring/ names:\n  %s",
				metricsTimeout, strings.Join(missing, "\n  "))
		}
		if time.Since(flip) > time.Second {
			up.toggle(t)
			// A registry change, which the relay's follower writes to
			// Redis and the reader applies (relay_lag_seconds,
			// relay_reads_total, registry_version).
			reg.MustExec(t, `UPDATE pgcluster_nodes SET healthy = NOT healthy WHERE name = 'bad_name'`)
			flip = time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, name := range slices.Sorted(maps.Keys(uses)) {
		kind := "exported"
		switch {
		case recorded[name]:
			kind = "recorded by " + rulesFile
		case ex[name] != name:
			kind = "a series of " + ex[name] + ", exported"
		}
		t.Logf("%s: %s; used %d times", name, kind, len(uses[name]))
	}
}

// exported reads the instance's /metrics.
func (in *instance) exported() (exported, error) {
	body, err := in.ReadMetrics()
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %w", err)
	}
	return parseExposition(strings.NewReader(body))
}

// tcpBackend is a node that accepts TCP connections, and can stop and
// start again on the same address.
type tcpBackend struct {
	*coretest.Backend
	host string
	port int
}

func listenTCP(t testing.TB, host string) *tcpBackend {
	t.Helper()
	b := coretest.NewBackend(t, host)
	return &tcpBackend{Backend: b, host: b.Host, port: b.Port}
}

// toggle closes the listener, or opens it again.
func (b *tcpBackend) toggle(t testing.TB) { b.Toggle(t) }
