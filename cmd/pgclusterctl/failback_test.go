package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// failback deletes an alias's move, says where it had moved and why, and
// exits 1 for an alias that had not moved, 2 without an alias.
func TestFailback(t *testing.T) {
	pg := pgtest.New(t)
	pg.MustExec(t, pgcluster.Schema)
	pg.MustExec(t, `INSERT INTO pgcluster_aliases (alias, target, fallback) VALUES ('prod', 'local', '{dr}');
INSERT INTO pgcluster_alias_state (alias, target, reason) VALUES ('prod', 'dr', 'no serving primary in local for 30s')`)
	runIt := func(args ...string) (int, string, string) {
		var out, errOut bytes.Buffer
		code := run(context.Background(), append([]string{"failback", "-postgres", pg.DSN("")}, args...), &out, &errOut)
		return code, out.String(), errOut.String()
	}
	code, out, errOut := runIt("PROD")
	if code != exitOK || !strings.Contains(out, "alias prod points at local again (it had failed over to dr at ") || !strings.Contains(out, "no serving primary in local for 30s") {
		t.Fatalf("failback: exit %d, %q, %q", code, out, errOut)
	}
	var n int
	if err := pg.QueryRow(context.Background(), "SELECT count(*) FROM pgcluster_alias_state", &n); err != nil || n != 0 {
		t.Fatalf("%d rows left in pgcluster_alias_state, %v", n, err)
	}
	if code, _, errOut := runIt("prod"); code != exitNotOK || !strings.Contains(errOut, "has not failed over") {
		t.Errorf("failback of an alias on its own target: exit %d, %q", code, errOut)
	}
	if code, _, errOut := runIt(); code != exitFailed || !strings.Contains(errOut, "give one alias") {
		t.Errorf("failback without an alias: exit %d, %q", code, errOut)
	}
}

// status shows a drained node in its row and the cluster's line, and a
// drained primary as a cluster without one (exit 1).
func TestStatusDrained(t *testing.T) {
	pg := pgtest.New(t)
	pg.MustExec(t, pgcluster.Schema)
	pg.MustExec(t, `INSERT INTO pgcluster_nodes (cluster, name, address, role) VALUES
  ('local', 'pg1', '192.0.2.1', 'primary'), ('local', 'pg2', '192.0.2.2', 'standby');
INSERT INTO pgcluster_drains (cluster, node, reason, created_by) VALUES ('local', 'pg2', 'reindex', 'alice')`)
	status := func() (int, string) {
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"status", "-postgres", pg.DSN("")}, &out, &errOut)
		return code, out.String() + errOut.String()
	}
	code, out := status()
	if code != exitOK || !strings.Contains(out, "local: 1 serving, 0 out, 1 drained; primary pg1") || !strings.Contains(out, "serving; drained: reindex (until undrained, by alice, drain 1)") {
		t.Errorf("status with pg2 drained: exit %d\n%s", code, out)
	}
	pg.MustExec(t, "INSERT INTO pgcluster_drains (cluster, node, reason) VALUES ('local', 'pg1', 'forced')")
	if code, out := status(); code != exitNotOK || !strings.Contains(out, "PRIMARY pg1 DRAINED: primary.local has no address") {
		t.Errorf("status with the primary drained: exit %d\n%s", code, out)
	}
}
