package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/proc"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// The drain commands run against a real registry: a PostgreSQL server
// started by internal/pgtest with pgcluster.Schema. Node addresses are of
// 192.0.2.0/24, which nothing here connects to.

// drainRegistry starts a registry holding cluster local: pg1 the primary
// and pg2 a standby in topology zone a, pg3 a standby in zone b. It
// returns the registry and its DSN.
func drainRegistry(t testing.TB) (*pgtest.Postgres, string) {
	t.Helper()
	reg := registry(t)
	reg.MustExec(t, `INSERT INTO pgcluster_nodes (cluster, name, address, role, zone) VALUES
		('local', 'pg1', '192.0.2.1', 'primary', 'a'),
		('local', 'pg2', '192.0.2.2', 'standby', 'a'),
		('local', 'pg3', '192.0.2.3', 'standby', 'b')`)
	return reg, reg.DSN("")
}

// ctl runs pgclusterctl with args and returns its exit status, standard
// output and standard error.
func ctl(t testing.TB, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut strings.Builder
	code := run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// drainJSON runs drain -json with args, wants it to make a drain, and
// decodes it.
func drainJSON(t testing.TB, args ...string) drainMade {
	t.Helper()
	code, out, errOut := ctl(t, append(append([]string{"drain"}, args...), "-json")...)
	var m drainMade
	if err := json.Unmarshal([]byte(out), &m); code != exitOK || err != nil {
		t.Fatalf("drain %q: exit %d (%v), want a drain made\nstdout:\n%s\nstderr:\n%s", args, code, err, out, errOut)
	}
	return m
}

// drainsJSON runs drains -json with args and decodes its list.
func drainsJSON(t testing.TB, args ...string) drainList {
	t.Helper()
	code, out, errOut := ctl(t, append(append([]string{"drains"}, args...), "-json")...)
	var l drainList
	if err := json.Unmarshal([]byte(out), &l); code != exitOK || err != nil {
		t.Fatalf("drains %q: exit %d (%v)\nstdout:\n%s\nstderr:\n%s", args, code, err, out, errOut)
	}
	return l
}

// scan runs sql on the registry at dsn and scans its one row into dest.
func scan(t testing.TB, dsn, sql string, args []any, dest ...any) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// drainCount is how many rows pgcluster_drains has.
func drainCount(t testing.TB, dsn string) int {
	t.Helper()
	var n int
	scan(t, dsn, "SELECT count(*) FROM pgcluster_drains", nil, &n)
	return n
}

// A standby drained for 30s: the row names it (in the case given), ends 30
// seconds after it was made by PostgreSQL's clock, was made by the DSN's
// role, and drain prints it with the node it matches, until and by.
func TestDrainStandbyFor(t *testing.T) {
	_, dsn := drainRegistry(t)
	m := drainJSON(t, "-postgres", dsn, "-cluster", "LOCAL", "-node", "PG2", "-reason", "kernel upgrade", "-for", "30s")
	d := m.Drain
	if d.ID == 0 || d.Cluster != "LOCAL" || d.Node == nil || *d.Node != "PG2" || d.Zone != nil || d.Reason != "kernel upgrade" ||
		!slices.Equal(d.Matches, []string{"pg2"}) || d.By != "postgres" || len(m.Warnings) != 0 {
		t.Errorf("drain made: %+v, warnings %q; want LOCAL/PG2 matching pg2, by postgres, no warning", d, m.Warnings)
	}
	if d.Until == nil || d.Left == nil || math.Abs(d.Until.Sub(d.Created).Seconds()-30) > 1 || math.Abs(*d.Left-30) > 1 {
		t.Errorf("drain made: until %v, created %v, left %v; want until 30s after created", d.Until, d.Created, d.Left)
	}
	var node, reason string
	var byRole bool
	var lasts, left float64
	scan(t, dsn, `SELECT node, reason, created_by = current_user, extract(epoch FROM until - created_at), extract(epoch FROM until - now())
		FROM pgcluster_drains WHERE id = $1`, []any{d.ID}, &node, &reason, &byRole, &lasts, &left)
	if node != "PG2" || reason != "kernel upgrade" || !byRole || math.Abs(lasts-30) > 1 || left <= 28 || left > 30 {
		t.Errorf("the row: node %q, reason %q, by the DSN's role %v, lasts %vs, %vs left; want PG2, 30s", node, reason, byRole, lasts, left)
	}

	code, out, errOut := ctl(t, "drain", "-postgres", dsn, "-cluster", "local", "-node", "pg3", "-reason", "disk swap", "-for", "1h", "-force")
	row := regexp.MustCompile(`(?m)^\d+ +local +pg3 +disk swap +\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ +(59m59s|1h0m0s) +postgres +\d{4}-\S+Z +pg3$`)
	if code != exitOK || !strings.Contains(out, "drain ") || !strings.Contains(out, "ID  CLUSTER  NODE/ZONE") || !row.MatchString(out) {
		t.Errorf("drain: exit %d, want %d and a row matching %s\nstdout:\n%s\nstderr:\n%s", code, exitOK, row, out, errOut)
	}
}

// The guards: a drain is refused (exit 1, nothing written) when it takes
// out the primary, or the last serving node of the cluster's name or of
// standby., counting only the nodes that serve now (healthy, fresh with
// -stale-after, drained by no other drain, whatever the case it names
// them in); -force makes it anyway and says which guards it passed. -zone
// names the names.
func TestDrainGuards(t *testing.T) {
	reg, dsn := drainRegistry(t)
	reg.MustExec(t, `INSERT INTO pgcluster_nodes (cluster, name, address, role, healthy, heartbeat) VALUES
		('one', 'o1', '192.0.2.11', 'unknown', true, now()),
		('sick', 's1', '192.0.2.21', 'standby', true, now()),
		('sick', 's2', '192.0.2.22', 'standby', false, now()),
		('old', 'n1', '192.0.2.31', 'standby', true, now()),
		('old', 'n2', '192.0.2.32', 'standby', true, now() - interval '1 hour'),
		('whole', 'w1', '192.0.2.41', 'primary', true, now()),
		('whole', 'w2', '192.0.2.42', 'standby', true, now())`)
	base := []string{"drain", "-postgres", dsn, "-reason", "maintenance"}
	for _, step := range []struct {
		args  []string
		code  int
		wants []string // in standard error
	}{
		{[]string{"-cluster", "Local", "-node", "PG2"}, exitOK, nil},
		{[]string{"-cluster", "local", "-node", "pg3"}, exitNotOK, []string{
			"pgclusterctl drain: refused: draining pg3 would leave standby.local.pgcluster.lan. with no serving node (1 serving now: pg3); -force drains anyway\n"}},
		{[]string{"-cluster", "local", "-topology-zone", "B"}, exitNotOK, []string{
			"refused: draining topology zone B of local (pg3) would leave standby.local.pgcluster.lan. with no serving node (1 serving now: pg3); -force drains anyway\n"}},
		{[]string{"-cluster", "local", "-node", "pg1"}, exitNotOK, []string{
			"pgclusterctl drain: refused: pg1 is the primary of local; switch over first (pg_ctl promote a standby), or -force\n"}},
		{[]string{"-cluster", "one", "-node", "o1", "-zone", "example.org"}, exitNotOK, []string{
			"refused: draining o1 would leave one.example.org. with no serving node (1 serving now: o1); -force drains anyway\n"}},
		{[]string{"-cluster", "sick", "-node", "s1"}, exitNotOK, []string{
			"refused: draining s1 would leave sick.pgcluster.lan. with no serving node (1 serving now: s1)",
			"refused: draining s1 would leave standby.sick.pgcluster.lan. with no serving node (1 serving now: s1)"}},
		{[]string{"-cluster", "old", "-node", "n1", "-stale-after", "10s"}, exitNotOK, []string{
			"refused: draining n1 would leave old.pgcluster.lan. with no serving node (1 serving now: n1)"}},
		{[]string{"-cluster", "whole"}, exitNotOK, []string{
			"refused: w1 is the primary of whole",
			"refused: draining every node of whole (w1, w2) would leave whole.pgcluster.lan. with no serving node (2 serving now: w1, w2)",
			"refused: draining every node of whole (w1, w2) would leave standby.whole.pgcluster.lan. with no serving node (1 serving now: w2)"}},
		{[]string{"-cluster", "old", "-node", "n1"}, exitOK, nil}, // without -stale-after, n2 serves
		{[]string{"-cluster", "local", "-node", "pg1", "-force"}, exitOK, []string{
			"pgclusterctl drain: warning: -force: pg1 is the primary of local\n"}},
		{[]string{"-cluster", "local", "-node", "pg3", "-force"}, exitOK, []string{
			"warning: -force: draining pg3 would leave local.pgcluster.lan. with no serving node (1 serving now: pg3)\n",
			"warning: -force: draining pg3 would leave standby.local.pgcluster.lan. with no serving node (1 serving now: pg3)\n"}},
	} {
		before := drainCount(t, dsn)
		code, out, errOut := ctl(t, append(base, step.args...)...)
		if code != step.code {
			t.Errorf("drain %q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", step.args, code, step.code, out, errOut)
		}
		for _, want := range step.wants {
			if !strings.Contains(errOut, want) {
				t.Errorf("drain %q: standard error lacks %q:\n%s", step.args, want, errOut)
			}
		}
		after, made := drainCount(t, dsn), 0
		if step.code == exitOK {
			made = 1
		}
		if after != before+made {
			t.Errorf("drain %q: %d drains before, %d after; want %d made", step.args, before, after, made)
		}
	}
}

// -for must be positive, and the other flags make sense: else exit 2 with
// what to do, and nothing is written.
func TestDrainUsage(t *testing.T) {
	_, dsn := drainRegistry(t)
	base := []string{"drain", "-postgres", dsn, "-cluster", "local", "-node", "pg2"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(base, "-reason", "r", "-for", "0"), "pgclusterctl drain: -for 0s is not positive: give how long the drain lasts (as 30m), or leave -for out"},
		{append(base, "-reason", "r", "-for", "-5s"), "pgclusterctl drain: -for -5s is not positive"},
		{append(base, "-reason", "r", "-for", "soon"), `invalid value "soon" for flag -for`},
		{append(base, "-reason", "r", "-for", "500ms"), "-for 500ms is shorter than 1s"},
		{base, "-reason TEXT is required"},
		{append(base, "-reason", "  "), "-reason TEXT is required"},
		{append(base, "-reason", strings.Repeat("é", 201)), "-reason is 201 characters long, longer than the 200 pgcluster_drains takes"},
		{append(base, "-reason", "r", "-topology-zone", "a"), "-node and -topology-zone exclude each other"},
		{[]string{"drain", "-postgres", dsn, "-reason", "r"}, "-cluster C is required"},
		{[]string{"drain", "-cluster", "local", "-reason", "r"}, "-postgres DSN is required"},
		{append(base, "-reason", "r", "extra"), `unexpected argument "extra"`},
		{append(base, "-reason", "r", "-stale-after", "-1s"), "-stale-after -1s is negative"},
	} {
		code, out, errOut := ctl(t, tc.args...)
		if code != exitFailed || !strings.Contains(errOut, tc.want) {
			t.Errorf("%q: exit %d, want %d with %q\nstdout:\n%s\nstderr:\n%s", tc.args[3:], code, exitFailed, tc.want, out, errOut)
		}
	}
	if n := drainCount(t, dsn); n != 0 {
		t.Errorf("%d drains made by refused command lines", n)
	}
	if code, out, _ := ctl(t, "drain", "-h"); code != exitOK || out != "" {
		t.Errorf("drain -h: exit %d, want %d, the usage on standard error", code, exitOK)
	}
}

// A drain that matches no node now (no such node, no such cluster, no node
// in the zone) is accepted, with a warning that says so, and listed as
// matching nothing.
func TestDrainMatchingNothing(t *testing.T) {
	_, dsn := drainRegistry(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-cluster", "local", "-node", "pg9"}, "cluster local has no node pg9 in pgcluster_nodes; it drains a node of that name once one joins"},
		{[]string{"-cluster", "nowhere", "-node", "x1"}, "pgcluster_nodes has no cluster nowhere; it drains its node x1 once it joins"},
		{[]string{"-cluster", "local", "-topology-zone", "c"}, "no node of cluster local is in topology zone c; it drains those that join it"},
	} {
		code, out, errOut := ctl(t, append([]string{"drain", "-postgres", dsn, "-reason", "planned"}, tc.args...)...)
		warning := regexp.MustCompile(`pgclusterctl drain: warning: drain \d+ matches nothing now: ` + regexp.QuoteMeta(tc.want))
		if code != exitOK || !warning.MatchString(errOut) || !regexp.MustCompile(`(?m) nothing$`).MatchString(out) {
			t.Errorf("drain %q: exit %d, want %d, a warning matching %s and MATCHES nothing\nstdout:\n%s\nstderr:\n%s", tc.args, code, exitOK, warning, out, errOut)
		}
	}
	l := drainsJSON(t, "-postgres", dsn)
	if len(l.Drains) != 3 {
		t.Fatalf("drains lists %d drains, want 3: %+v", len(l.Drains), l.Drains)
	}
	for _, d := range l.Drains {
		if d.Matches == nil || len(d.Matches) != 0 {
			t.Errorf("drain %d of %s matches %q, want nothing ([])", d.ID, d.Cluster, d.Matches)
		}
	}
	_, out, _ := ctl(t, "drains", "-postgres", dsn)
	if got := len(regexp.MustCompile(`(?m) nothing$`).FindAllString(out, -1)); got != 3 {
		t.Errorf("drains shows %d drains matching nothing, want 3:\n%s", got, out)
	}
}

// undrain deletes a drain by its ID, or every drain of a node (whatever
// the case it names it in), says what it deleted, and exits 1 when
// nothing matched.
func TestUndrain(t *testing.T) {
	reg, dsn := drainRegistry(t)
	a := drainJSON(t, "-postgres", dsn, "-cluster", "local", "-node", "pg2", "-reason", "first").Drain
	b := drainJSON(t, "-postgres", dsn, "-cluster", "local", "-node", "PG2", "-reason", "second").Drain
	c := drainJSON(t, "-postgres", dsn, "-cluster", "local", "-node", "pg2", "-reason", "third", "-for", "1h").Drain
	reg.MustExec(t, `INSERT INTO pgcluster_drains (cluster, reason) VALUES ('local', 'the whole cluster')`)
	undrain := func(args ...string) (int, string, string) {
		return ctl(t, append([]string{"undrain", "-postgres", dsn}, args...)...)
	}

	code, out, errOut := undrain(fmt.Sprint(a.ID))
	if want := fmt.Sprintf("deleted drain %d of local: its node pg2 (first)\n1 drain deleted from registry ", a.ID); code != exitOK || !strings.HasPrefix(out, want) {
		t.Errorf("undrain %d: exit %d, want %d and %q\nstdout:\n%s\nstderr:\n%s", a.ID, code, exitOK, want, out, errOut)
	}
	code, _, errOut = undrain(fmt.Sprint(a.ID))
	if want := fmt.Sprintf("has no drain %d (pgclusterctl drains -all lists them)", a.ID); code != exitNotOK || !strings.Contains(errOut, want) {
		t.Errorf("undrain %d again: exit %d, want %d and %q:\n%s", a.ID, code, exitNotOK, want, errOut)
	}
	code, out, errOut = undrain("-cluster", "LOCAL", "-node", "pg2")
	for _, want := range []string{fmt.Sprintf("deleted drain %d of local: its node PG2 (second)\n", b.ID), fmt.Sprintf("deleted drain %d of local: its node pg2 (third)\n", c.ID), "2 drains deleted"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("undrain -cluster LOCAL -node pg2: exit %d, want %d and %q\nstdout:\n%s\nstderr:\n%s", code, exitOK, want, out, errOut)
		}
	}
	code, _, errOut = undrain("-cluster", "local", "-node", "pg2")
	if want := "has no drain of node pg2 in cluster local (pgclusterctl drains -all lists them; a drain of a whole cluster or of a topology zone is deleted by its ID)"; code != exitNotOK || !strings.Contains(errOut, want) {
		t.Errorf("undrain of a node without drains: exit %d, want %d and %q:\n%s", code, exitNotOK, want, errOut)
	}
	if l := drainsJSON(t, "-postgres", dsn); len(l.Drains) != 1 || l.Drains[0].Reason != "the whole cluster" {
		t.Errorf("after the undrains, drains lists %+v; want the whole cluster's drain only", l.Drains)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "give a drain ID (pgclusterctl drains lists them), or -cluster C -node N"},
		{[]string{"-cluster", "local"}, "give a drain ID"},
		{[]string{"x"}, `"x" is not a drain ID`},
		{[]string{"0"}, `"0" is not a drain ID`},
		{[]string{"-cluster", "local", "-node", "pg2", "7"}, "give a drain ID, or -cluster and -node, not both"},
		{[]string{"7", "-cluster", "local"}, `unexpected argument "-cluster": give one drain ID, after the flags`},
	} {
		if code, _, errOut := undrain(tc.args...); code != exitFailed || !strings.Contains(errOut, tc.want) {
			t.Errorf("undrain %q: exit %d, want %d with %q:\n%s", tc.args, code, exitFailed, tc.want, errOut)
		}
	}
}

// drains lists the active drains, what each takes and matches now, until
// when and how long is left by PostgreSQL's clock; -all adds the ended
// ones, marked ended; -json says the same. Text from the registry reaches
// the terminal without its control characters.
func TestDrainsList(t *testing.T) {
	reg, dsn := drainRegistry(t)
	code, out, _ := ctl(t, "drains", "-postgres", dsn)
	if want := "registry " + pgcluster.RegistryName(dsn) + ": no active drain\n"; code != exitOK || out != want {
		t.Errorf("drains of an empty table: exit %d, %q; want %q", code, out, want)
	}
	node := drainJSON(t, "-postgres", dsn, "-cluster", "local", "-node", "pg2", "-reason", "kernel\tupgrade\x1b[2J", "-for", "1h").Drain
	zone := drainJSON(t, "-postgres", dsn, "-cluster", "local", "-topology-zone", "A", "-reason", "rack a", "-force").Drain
	reg.MustExec(t, `INSERT INTO pgcluster_drains (cluster, reason, created_by) VALUES ('local', 'the whole cluster', 'ops')`)
	reg.MustExec(t, `INSERT INTO pgcluster_drains (cluster, node, reason, until, created_at)
		VALUES ('local', 'pg3', 'done', now() - interval '1 minute', now() - interval '1 hour')`)

	_, out, _ = ctl(t, "drains", "-postgres", dsn)
	for _, re := range []string{
		`^registry \S+: 3 active drains\n\nID +CLUSTER +NODE/ZONE +REASON +UNTIL +LEFT +BY +CREATED +MATCHES\n`,
		fmt.Sprintf(`(?m)^%d +local +pg2 +kernel\?upgrade\?\[2J +\S+Z +(59m59s|1h0m0s) +postgres +\S+Z +pg2$`, node.ID),
		fmt.Sprintf(`(?m)^%d +local +zone A +rack a +- +- +postgres +\S+Z +pg1, pg2$`, zone.ID),
		`(?m)^\d+ +local +\(cluster\) +the whole cluster +- +- +ops +\S+Z +pg1, pg2, pg3$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("drains lacks a match of %s:\n%s", re, out)
		}
	}
	if strings.Contains(out, "done") || strings.Contains(out, "\x1b") {
		t.Errorf("drains lists the ended drain, or shows an escape:\n%s", out)
	}
	_, out, _ = ctl(t, "drains", "-postgres", dsn, "-all")
	if !strings.Contains(out, ": 3 active drains, 1 ended\n") || !regexp.MustCompile(`(?m)^\d+ +local +pg3 +done +\S+Z +ended +postgres +\S+Z +pg3$`).MatchString(out) {
		t.Errorf("drains -all does not list the ended drain as ended:\n%s", out)
	}

	l := drainsJSON(t, "-postgres", dsn)
	if len(l.Drains) != 3 || l.All || l.Registry != pgcluster.RegistryName(dsn) {
		t.Fatalf("drains -json: %+v, want the 3 active drains", l)
	}
	n, z, c := l.Drains[0], l.Drains[1], l.Drains[2]
	if n.ID != node.ID || n.Reason != "kernel\tupgrade\x1b[2J" || n.Until == nil || n.Left == nil || *n.Left < 3590 || n.Ended || !slices.Equal(n.Matches, []string{"pg2"}) {
		t.Errorf("the node's drain: %+v", n)
	}
	if z.Zone == nil || *z.Zone != "A" || z.Node != nil || z.Until != nil || z.Left != nil || !slices.Equal(z.Matches, []string{"pg1", "pg2"}) {
		t.Errorf("the zone's drain: %+v", z)
	}
	if c.Node != nil || c.Zone != nil || c.By != "ops" || !slices.Equal(c.Matches, []string{"pg1", "pg2", "pg3"}) {
		t.Errorf("the cluster's drain: %+v", c)
	}
	l = drainsJSON(t, "-postgres", dsn, "-all")
	if len(l.Drains) != 4 || !l.All {
		t.Fatalf("drains -all -json lists %d drains, want 4", len(l.Drains))
	}
	if e := l.Drains[3]; !e.Ended || e.Left == nil || *e.Left > -59 || e.Until == nil || !slices.Equal(e.Matches, []string{"pg3"}) {
		t.Errorf("the ended drain: %+v; want ended, a minute ago", e)
	}
}

// Two drains of a cluster made at once, each of one of its last two
// serving standbys: exactly one is made, the other refused, every time.
// The drain lock makes the second count the first.
func TestDrainConcurrent(t *testing.T) {
	_, dsn := drainRegistry(t)
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for round := range 10 {
		start := make(chan struct{})
		var wg sync.WaitGroup
		codes := make([]int, 2)
		errs := make([]string, 2)
		for i, node := range []string{"pg2", "pg3"} {
			wg.Go(func() {
				var out, errOut strings.Builder
				<-start
				codes[i] = run(context.Background(), []string{"drain", "-postgres", dsn, "-cluster", "local", "-node", node, "-reason", "race"}, &out, &errOut)
				errs[i] = errOut.String()
			})
		}
		close(start)
		wg.Wait()
		slices.Sort(codes)
		if !slices.Equal(codes, []int{exitOK, exitNotOK}) {
			t.Errorf("round %d: exit statuses %v, want one drain made and one refused\n%s", round, codes, strings.Join(errs, ""))
		}
		if n := drainCount(t, dsn); n != 1 {
			t.Errorf("round %d: %d drains made, want 1", round, n)
		}
		if _, err := conn.Exec(context.Background(), "DELETE FROM pgcluster_drains"); err != nil {
			t.Fatal(err)
		}
	}
}

// With -redis, the guards count the nodes as the fleet's checks let them
// serve: a fleet whose Redis holds no status yet answers them by the
// registry. Redis unreachable: nothing is made, exit 2.
func TestDrainWithRedis(t *testing.T) {
	_, dsn := drainRegistry(t)
	rds := redistest.Start(t)
	base := []string{"drain", "-postgres", dsn, "-redis", rds.URL(), "-cluster", "local", "-reason", "r"}
	if code, out, errOut := ctl(t, append(base, "-node", "pg2")...); code != exitOK {
		t.Fatalf("drain pg2: exit %d\n%s%s", code, out, errOut)
	}
	code, _, errOut := ctl(t, append(base, "-node", "pg3")...)
	if code != exitNotOK || !strings.Contains(errOut, "would leave standby.local.pgcluster.lan. with no serving node (1 serving now: pg3)") {
		t.Errorf("drain pg3 with pg2 drained: exit %d, want %d, refused:\n%s", code, exitNotOK, errOut)
	}
	closed, err := proc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	code, _, errOut = ctl(t, "drain", "-postgres", dsn, "-redis", fmt.Sprintf("redis://127.0.0.1:%d", closed), "-cluster", "local", "-node", "pg1", "-reason", "r", "-force")
	if code != exitFailed || !strings.Contains(errOut, "Redis does not answer") {
		t.Errorf("drain with Redis unreachable: exit %d, want %d and Redis does not answer:\n%s", code, exitFailed, errOut)
	}
	if n := drainCount(t, dsn); n != 1 {
		t.Errorf("%d drains, want 1: the one made", n)
	}
}

// Without pgcluster_drains, or the privileges a command needs, each says
// what to do and exits 2; the GRANT it names is the one that works.
func TestDrainRegistryErrors(t *testing.T) {
	reg, dsn := drainRegistry(t)
	reg.MustExec(t, "CREATE DATABASE old")
	reg.MustExec(t, "CREATE DATABASE bare")
	old := reg.DSN("old")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, pgcluster.Schema+"; DROP TABLE pgcluster_drains"); err != nil {
		t.Fatal(err)
	}
	conn.Close(ctx)
	reg.MustExec(t, `CREATE ROLE oncall LOGIN; GRANT SELECT ON pgcluster_nodes, pgcluster_drains TO oncall`)
	oncall := strings.Replace(dsn, "postgres://postgres@", "postgres://oncall@", 1)
	closed, err := proc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	const pw = "s3cretPW"
	drain := []string{"-cluster", "local", "-node", "pg2", "-reason", "r"}
	grant := "To fix: GRANT SELECT, INSERT, DELETE ON pgcluster_drains TO oncall; GRANT USAGE ON SEQUENCE pgcluster_drains_id_seq TO oncall"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append([]string{"drain", "-postgres", old}, drain...), "has no pgcluster_drains table: it was made by a version without drains. To fix: apply this version's schema.sql"},
		{[]string{"drains", "-postgres", old}, "has no pgcluster_drains table"},
		{[]string{"undrain", "-postgres", old, "1"}, "has no pgcluster_drains table"},
		{[]string{"drains", "-postgres", reg.DSN("bare")}, "has no registry tables. To fix: apply schema.sql"},
		{append([]string{"drain", "-postgres", oncall}, drain...),
			"denies oncall INSERT on pgcluster_drains, USAGE on the sequence pgcluster_drains_id_seq (permission denied). " + grant},
		{[]string{"undrain", "-postgres", oncall, "1"}, "denies oncall DELETE on pgcluster_drains (permission denied). " + grant},
		{[]string{"drains", "-postgres", fmt.Sprintf("postgres://ops:%s@127.0.0.1:%d/registry?connect_timeout=2", pw, closed)},
			fmt.Sprintf("pgclusterctl drains: -postgres: registry 127.0.0.1:%d/registry unreachable", closed)},
	} {
		code, out, errOut := ctl(t, tc.args...)
		if code != exitFailed || !strings.Contains(errOut, tc.want) || strings.Contains(out+errOut, pw) {
			t.Errorf("%s: exit %d, want %d with %q (and no password)\nstdout:\n%s\nstderr:\n%s", tc.args[0], code, exitFailed, tc.want, out, errOut)
		}
	}
	if code, _, errOut := ctl(t, "drains", "-postgres", oncall); code != exitOK {
		t.Errorf("drains by a role that may read pgcluster_drains: exit %d:\n%s", code, errOut)
	}
	reg.MustExec(t, strings.TrimPrefix(grant, "To fix: "))
	if code, _, errOut := ctl(t, append([]string{"drain", "-postgres", oncall}, drain...)...); code != exitOK {
		t.Errorf("drain after the GRANT it names: exit %d:\n%s", code, errOut)
	}
	var by string
	scan(t, dsn, "SELECT created_by FROM pgcluster_drains", nil, &by)
	if by != "oncall" {
		t.Errorf("drain made by %q, want oncall", by)
	}
	if code, _, errOut := ctl(t, "undrain", "-postgres", oncall, "-cluster", "local", "-node", "pg2"); code != exitOK {
		t.Errorf("undrain after the GRANT: exit %d:\n%s", code, errOut)
	}
}

// The guards judge by the role answered (the check's while it is up, not
// the registry's), leave a lagging standby out of standby., and never
// count on a node of unknown state.
func TestGuardsJudgeAsTheFleet(t *testing.T) {
	ptr := func(s string) *string { return &s }
	node := func(name, state, role string, lagging bool) nodeReport {
		return nodeReport{Name: name, State: state, RegistryRole: "standby", role: role, Lagging: lagging}
	}
	r := &report{Clusters: []clusterReport{{Name: "local", Nodes: []nodeReport{
		node("pg1", "in", "standby", false),
		node("pg2", "in", "primary", false), // promoted: the registry still says standby
		node("pg3", "in", "standby", true),
		node("pg4", stateUnknown, "standby", false),
	}}}}
	for _, tc := range []struct {
		drain  string
		others []string
		want   []string
	}{
		{"pg2", nil, []string{"pg2 is the primary of local; switch over first (pg_ctl promote a standby), or -force"}},
		{"pg3", nil, nil},
		{"pg1", nil, []string{"draining pg1 would leave standby.local.z. with no serving node (1 serving now: pg1; 1 of unknown state, never counted on: pg4); -force drains anyway"}},
		{"pg4", []string{"pg1"}, []string{"draining pg4 would leave standby.local.z. with no serving node (0 serving now; 1 of unknown state, never counted on: pg4); -force drains anyway"}},
		{"pg4", nil, nil},
	} {
		var others []drain
		for _, o := range tc.others {
			others = append(others, drain{Cluster: "local", Node: ptr(o), Matches: []string{o}})
		}
		var got []string
		for _, ref := range guards(r, drain{Cluster: "LOCAL", Node: ptr(tc.drain), Matches: []string{tc.drain}}, others, "Z") {
			got = append(got, ref.String())
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("drain %s (others %q): refusals %q, want %q", tc.drain, tc.others, got, tc.want)
		}
	}
	if got := guards(r, drain{Cluster: "elsewhere", Matches: []string{}}, nil, "z."); got != nil {
		t.Errorf("a drain of a cluster without nodes: refusals %v, want none", got)
	}
}
