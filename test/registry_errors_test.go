package test

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/logtest"
)

// captureLog sends the log to a buffer until the test ends.
func captureLog(t *testing.T) *logtest.Buffer { return logtest.Capture(t, os.Stderr) }

// logged waits until the log has a line with every one of parts, and returns it.
func logged(t *testing.T, buf *logtest.Buffer, parts ...string) string {
	t.Helper()
	var line string
	Eventually(t, 20*time.Second, func() error {
		var ok bool
		if line, ok = buf.Line(parts...); !ok {
			return fmt.Errorf("no log line with all of %q", parts)
		}
		return nil
	})
	return line
}

// TestRegistryErrorLogs: what the log says when the registry refuses access
// at start-up (no snapshot yet) and when its schema loses a column (answers
// from the last snapshot): what is wrong and what to do, never
// "unreachable", never the password.
func TestRegistryErrorLogs(t *testing.T) {
	const password = "s3cret-pw"
	buf := captureLog(t)
	pg := Registry(t)
	pg.MustExec(t, demoRegistry+`
CREATE ROLE dns LOGIN PASSWORD '`+password+`';`)
	dsn := fmt.Sprintf("postgres://dns:%s@127.0.0.1:%d/postgres?sslmode=disable", password, pg.Port)
	s := StartCoreDNS(t, Corefile(dsn, "refresh 1h"))

	// Permission denied, before any load.
	line := logged(t, buf, "permission denied")
	for _, want := range []string{
		"denies access to the registry tables",
		`GRANT SELECT ON pgcluster_nodes, pgcluster_aliases, pgcluster_networks, pgcluster_drains TO "dns"`,
		"no snapshot yet: the zone answers SERVFAIL and is not ready until the registry loads",
		fmt.Sprintf("127.0.0.1:%d/postgres", pg.Port),
	} {
		if !strings.Contains(line, want) {
			t.Errorf("log line lacks %q:\n%s", want, line)
		}
	}
	if strings.Contains(line, "unreachable") || strings.Contains(line, "last snapshot") {
		t.Errorf("log line says unreachable or last snapshot:\n%s", line)
	}
	if r := MustQuery(t, "udp", s.UDP, "local."+Zone, dns.TypeA); r.Rcode != dns.RcodeServerFailure {
		t.Errorf("before the first load: rcode %s, want SERVFAIL as the log says", dns.RcodeToString[r.Rcode])
	}

	pg.MustExec(t, "GRANT SELECT ON pgcluster_nodes, pgcluster_aliases TO dns")
	Eventually(t, 15*time.Second, func() error { return hasAddr(s, "pg1.local."+Zone, "192.0.2.11") })

	// A column goes missing: the next load fails.
	pg.MustExec(t, "ALTER TABLE pgcluster_nodes DROP COLUMN healthy")
	// A notification that asks for a full reload (as after a TRUNCATE, or
	// the refresh poll): the read of pgcluster_nodes fails.
	pg.MustExec(t, "SELECT pg_notify('pgcluster_changed', 'pgcluster_nodes')")
	line = logged(t, buf, "column is missing")
	for _, want := range []string{
		"has a registry schema older than this version",
		"apply schema.sql, or ALTER TABLE",
		"answers keep coming from the last snapshot",
		"healthy",
	} {
		if !strings.Contains(line, want) {
			t.Errorf("log line lacks %q:\n%s", want, line)
		}
	}
	if strings.Contains(line, "unreachable") || strings.Contains(line, "SERVFAIL") {
		t.Errorf("log line says unreachable or SERVFAIL:\n%s", line)
	}
	if err := hasAddr(s, "pg1.local."+Zone, "192.0.2.11"); err != nil {
		t.Errorf("answers from the last snapshot: %v", err)
	}
	pg.MustExec(t, "ALTER TABLE pgcluster_nodes ADD COLUMN healthy boolean NOT NULL DEFAULT true")
	logged(t, buf, "reachable again")

	if strings.Contains(buf.String(), password) {
		t.Errorf("the password is in the log:\n%s", buf)
	}
}
