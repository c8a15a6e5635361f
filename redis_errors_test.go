package pgcluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/logtest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
	"github.com/pgcluster/pgcluster/internal/tlstest"
)

// loggedLine waits until the log has a line with every one of parts, and
// returns it.
func loggedLine(t *testing.T, log *logtest.Buffer, parts ...string) string {
	t.Helper()
	var line string
	err := pgtest.WaitFor(15*time.Second, func() error {
		var ok bool
		if line, ok = log.Line(parts...); !ok {
			return fmt.Errorf("no log line with all of %q", parts)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return line
}

// redisCheckSettings are an instance's that shares its checks through the
// Redis at url.
func redisCheckSettings(url string) *settings {
	return &settings{zones: []string{testZone}, ttl: 5, dsn: "redis-errors", check: checkTCP,
		interval: 200 * time.Millisecond, timeout: 100 * time.Millisecond, rise: 1, fall: 1, allowLoopback: true,
		allDown: allDownClosed, redisURL: url, redisPrefix: "errors:"}
}

// TestRedisErrorLogs: what an instance that shares its checks through
// Redis logs when Redis is stopped, refuses its password, or presents a
// certificate this host does not trust: what happened and what to do,
// never go-redis's bare "context deadline exceeded".
func TestRedisErrorLogs(t *testing.T) {
	log := captureLog(t)
	rs := redistest.Start(t)
	if err := rs.Client(t).ConfigSet(t.Context(), "requirepass", "right").Err(); err != nil {
		t.Fatal(err)
	}
	// Stopped: nothing listens at its port.
	stopped := redistest.Start(t)
	stopped.Stop()
	runChecks(t, redisCheckSettings(stopped.URL()))
	line := loggedLine(t, log, "Redis: Redis does not answer (connection refused at "+stopped.Addr()+": no Redis listens there; check that Redis runs, and the host and port of the redis URL")
	t.Logf("stopped: %s", line)

	runChecks(t, redisCheckSettings("redis://:wrong@"+rs.Addr()))
	line = loggedLine(t, log, "Redis: Redis does not answer (Redis refused the user and password (authentication failed); check the password (and user) in the redis URL")
	t.Logf("wrong password: %s", line)

	ca := tlstest.New(t, "redis CA")
	files := ca.MustWrite(t, ca.MustIssue(t, "127.0.0.1"))
	ts := redistest.StartTLS(t, redistest.TLS{CertFile: files.Cert, KeyFile: files.Key, CAFile: files.CA, Client: ca.ClientConfig()})
	runChecks(t, redisCheckSettings(ts.URL()))
	line = loggedLine(t, log, "Redis: Redis does not answer", "Redis's TLS certificate is signed by an authority this host does not trust (TLS); add the CA that signed it to this host's CA bundle")
	t.Logf("untrusted CA: %s", line)

	if strings.Contains(log.String(), "Redis does not answer (context deadline exceeded)") {
		t.Error("a line gives go-redis's bare deadline as the reason")
	}
}

// TestRelayRedisErrorLogs: a relaying instance whose Redis is stopped says
// so when it follows PostgreSQL itself.
func TestRelayRedisErrorLogs(t *testing.T) {
	log := captureLog(t)
	pg := pgtest.New(t)
	pg.MustExec(t, Schema)
	stopped := redistest.Start(t)
	stopped.Stop()
	set := &settings{zones: []string{testZone}, dsn: pg.DSN(""), ttl: 5, refresh: time.Hour,
		redisURL: stopped.URL(), redisPrefix: "errors:"}
	startRelay(t, set)
	line := loggedLine(t, log, "Registry relay: connection refused at "+stopped.Addr()+": no Redis listens there", "following PostgreSQL here")
	t.Logf("relay, Redis stopped: %s", line)
}
