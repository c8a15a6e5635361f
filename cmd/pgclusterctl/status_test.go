package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/proc"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// registry starts a PostgreSQL server with the registry schema.
func registry(t testing.TB) *pgtest.Postgres {
	t.Helper()
	pg := pgtest.New(t)
	pg.MustExec(t, pgcluster.Schema)
	return pg
}

// statusJSON runs status -json with args and decodes its report.
func statusJSON(t testing.TB, args ...string) (int, report) {
	t.Helper()
	code, out, errOut := status(t, append(args, "-json")...)
	var r report
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("status -json (exit %d): %v\nstdout:\n%s\nstderr:\n%s", code, err, out, errOut)
	}
	return code, r
}

func (r report) cluster(name string) clusterReport {
	for _, c := range r.Clusters {
		if c.Name == name {
			return c
		}
	}
	return clusterReport{}
}

func (r report) node(cluster, name string) nodeReport {
	for _, n := range r.cluster(cluster).Nodes {
		if n.Name == name {
			return n
		}
	}
	return nodeReport{}
}

// A fleet of two bin/coredns instances with check tcp and Redis (signed
// statuses), over clusters in every state: local (a primary and two
// standbys), twin (two primaries: split brain), gone (its primary marked
// unhealthy), and rows that are skipped. status says of every node what the
// instances say in its TXT record (state= and reason=), names the lease
// holder that checked it, counts the skipped rows as the instances'
// rows_skipped does, sums each cluster up, and exits 1 (twin and gone have
// no serving primary). A node stopped by the operator shows as out,
// check_refused, checked by the live instance holding its lease. With
// another secret, every stored status is refused, as the instances would.
func TestStatusMatchesFleet(t *testing.T) {
	const secret = "0123456789abcdef-pgclusterctl"
	t.Setenv(secretEnv, secret)
	reg := registry(t)
	pg1, pg2, pg3 := newBackend(t, "127.0.0.61"), newBackend(t, "127.0.0.62"), newBackend(t, "127.0.0.63")
	t1, t2 := newBackend(t, "127.0.0.64"), newBackend(t, "127.0.0.65")
	g1 := newBackend(t, "127.0.0.66")
	reg.MustExec(t, `INSERT INTO pgcluster_nodes (cluster, name, address, port, role, healthy) VALUES
		('local', 'pg1', $1, $2, 'primary', true),
		('local', 'pg2', $3, $4, 'standby', true),
		('local', 'pg3', $5, $6, 'Standby ', true),
		('twin', 't1', $7, $8, 'primary', true),
		('twin', 't2', $9, $10, 'primary', true),
		('gone', 'g1', $11, $12, 'primary', false),
		('local', 'bad_name', '127.0.0.67', 5432, 'standby', true),
		('local', 'primary', '127.0.0.68', 5432, 'standby', true),
		('local', 'PG1', '127.0.0.69', 5432, 'standby', true)`,
		pg1.host, pg1.port, pg2.host, pg2.port, pg3.host, pg3.port, t1.host, t1.port, t2.host, t2.port, g1.host, g1.port)
	rds := redistest.Start(t)
	options := []string{
		"postgres " + reg.DSN(""),
		"allow_loopback",
		"check tcp",
		"interval 200ms",
		"timeout 100ms",
		"redis " + rds.URL(),
		"redis_secret " + secret,
	}
	fleet := []*instance{startInstance(t, options...), startInstance(t, options...)}
	args := []string{"-postgres", reg.DSN(""), "-redis", rds.URL(), "-allow-loopback"}

	// The fleet has settled once every node it checks has a verdict from a
	// live lease holder, and status agrees with both instances' TXT.
	var r report
	var code int
	pgtest.WaitFor(settleTimeout, func() error {
		code, r = statusJSON(t, args...)
		return agree(t, r, fleet, func(n nodeReport) error {
			if n.Registry == "in" && (n.Check == "unknown" || !n.CheckedByLive || n.CheckedBy != n.Lease) {
				return fmt.Errorf("not settled: check %s by %q (live %v), lease %q", n.Check, n.CheckedBy, n.CheckedByLive, n.Lease)
			}
			return nil
		})
	})
	if err := agree(t, r, fleet, nil); err != nil {
		t.Fatalf("the fleet did not settle within %v: %v", settleTimeout, err)
	}
	if code != exitNotOK || r.OK {
		t.Errorf("exit %d, ok %v; want %d: twin and gone have no single serving primary", code, r.OK, exitNotOK)
	}
	if len(r.Fleet.Members) != 2 {
		t.Errorf("fleet members %q, want the two instances", r.Fleet.Members)
	}
	// Each member's token leads to its instance: the name it stored is
	// its DNS listener, and the text output shows it beside the token.
	for _, in := range fleet {
		named := 0
		for _, tok := range r.Fleet.Members {
			if strings.HasSuffix(r.Fleet.Names[tok], " "+in.Addr()) {
				named++
			}
		}
		if named != 1 {
			t.Errorf("%d fleet members named by %s's listener %s, want one: %q", named, in, in.Addr(), r.Fleet.Names)
		}
	}
	_, text, _ := status(t, args...)
	for _, tok := range r.Fleet.Members {
		if shown := tok[:8] + " (" + r.Fleet.Names[tok] + ")"; !strings.Contains(text, shown) {
			t.Errorf("status does not show %q:\n%s", shown, text)
		}
	}
	for _, want := range []struct {
		cluster string
		ok      bool
		summary string
	}{
		{"local", true, "local: 3 serving, 0 out, 3 skipped; primary pg1"},
		{"twin", false, "twin: 2 serving, 0 out; SPLIT BRAIN: t1, t2 claim to be primary, primary.twin has no address"},
		{"gone", false, "gone: 0 serving, 1 out; NO SERVING PRIMARY: primary.gone has no address"},
	} {
		c := r.cluster(want.cluster)
		if c.OK != want.ok || c.Summary != want.summary {
			t.Errorf("cluster %s: ok %v, %q; want ok %v, %q", want.cluster, c.OK, c.Summary, want.ok, want.summary)
		}
	}
	if n := r.node("local", "pg3"); n.RegistryRole != "standby" || n.CheckRole != "" || n.Check != "up" {
		t.Errorf("pg3: registry role %q, check %s; want standby (the registry's 'Standby ' folded), up", n.RegistryRole, n.Check)
	}
	if n := r.node("gone", "g1"); n.Registry != "out" || n.RegistryReason != "unhealthy" || n.Reason != "unhealthy" {
		t.Errorf("g1: registry %s (%s), reason %s; want out, unhealthy", n.Registry, n.RegistryReason, n.Reason)
	}
	skipped := map[string]int{}
	for _, sk := range r.cluster("local").Skipped {
		skipped[sk.Reason]++
	}
	for _, reason := range []string{"invalid_name", "reserved_name", "duplicate"} {
		got, _ := fleet[0].metric(t, `coredns_pgcluster_rows_skipped{reason="`+reason+`"`)
		if want := strconv.Itoa(skipped[reason]); got != want || want != "1" {
			t.Errorf("rows skipped as %s: status says %s, the instance's rows_skipped %q; want 1 each", reason, want, got)
		}
	}

	// The operator stops pg3.
	pg3.stop()
	pgtest.WaitFor(settleTimeout, func() error {
		code, r = statusJSON(t, args...)
		n := r.node("local", "pg3")
		if n.State != "out" || n.Reason != "check_refused" {
			return fmt.Errorf("pg3 %s (%s)", n.State, n.Reason)
		}
		return agree(t, r, fleet, nil)
	})
	n := r.node("local", "pg3")
	if n.State != "out" || n.Reason != "check_refused" || n.Check != "down" || n.CheckCause != "refused" ||
		n.Registry != "in" || n.CheckedBy == "" || n.CheckedBy != n.Lease || !n.CheckedByLive ||
		!slices.Contains(r.Fleet.Members, n.CheckedBy) || !strings.Contains(n.Detail, "refused") {
		t.Fatalf("pg3 after its stop: %+v\nwant out, check_refused, registry in, down (refused), checked by the live lease holder", n)
	}
	if err := agree(t, r, fleet, nil); err != nil {
		t.Fatal(err)
	}
	_, text, _ = status(t, args...)
	row := regexp.MustCompile(`(?m)^local +pg3 +127\.0\.0\.63:` + strconv.Itoa(pg3.port) +
		` +-/- +standby +- +in +down \(refused\) +` + n.CheckedBy[:8] + ` +- +` + n.Lease[:8] + ` +out +check_refused: .*refused$`)
	if !row.MatchString(text) || !strings.Contains(text, "local: 2 serving, 1 out, 3 skipped; primary pg1\n") ||
		!strings.Contains(text, `  skipped, never served: node "bad_name" in cluster "local" (invalid_name): the cluster or node name is not a DNS label`) {
		t.Errorf("the table does not show pg3 out, or local's summary; want a row matching %s:\n%s", row, text)
	}
	t.Logf("status after pg3 stopped:\n%s", text)

	// With another secret, the statuses are refused as forged.
	t.Setenv(secretEnv, "another-secret-of-16-bytes")
	_, r = statusJSON(t, args...)
	if n := r.node("local", "pg1"); !strings.Contains(n.StatusError, "wrongly signed") || n.CheckedBy != "" {
		t.Errorf("pg1 read with another secret: status error %q, checked by %q; want refused, wrongly signed", n.StatusError, n.CheckedBy)
	}
}

// agree returns an error unless, for every node it judges, status's state
// and reason are those of the node's TXT record on every instance, and
// settled (when given) accepts the node.
func agree(t testing.TB, r report, fleet []*instance, settled func(nodeReport) error) error {
	for _, c := range r.Clusters {
		for _, n := range c.Nodes {
			if settled != nil {
				if err := settled(n); err != nil {
					return fmt.Errorf("%s/%s: %w", c.Name, n.Name, err)
				}
			}
			for i, in := range fleet {
				txt := in.txt(t, n.Name+"."+c.Name+"."+zone)
				if txt["state"] != n.State || txt["reason"] != n.Reason {
					return fmt.Errorf("%s/%s: status says %s (%s), instance %d's TXT %s (%s)", c.Name, n.Name, n.State, n.Reason, i, txt["state"], txt["reason"])
				}
			}
		}
	}
	return nil
}

// Without Redis, status judges by the registry alone, as an instance
// without checks: exit 0 while every cluster has one serving primary, 1
// when the primary is marked unhealthy, goes stale (with -stale-after), or
// two nodes are primary; an empty registry is not a fleet that serves.
func TestStatusExitCode(t *testing.T) {
	reg := registry(t)
	args := []string{"-postgres", reg.DSN("")}
	code, out, _ := status(t, args...)
	if code != exitNotOK || !strings.Contains(out, "the registry has no node served") {
		t.Errorf("empty registry: exit %d, want %d with 'the registry has no node served':\n%s", code, exitNotOK, out)
	}
	reg.MustExec(t, `INSERT INTO pgcluster_nodes (cluster, name, address, role) VALUES
		('local', 'pg1', '192.0.2.1', 'primary'), ('local', 'pg2', '192.0.2.2', 'standby')`)
	for _, step := range []struct {
		sql  string
		args []string
		code int
		want string
	}{
		{"", nil, exitOK, "local: 2 serving, 0 out; primary pg1\nevery cluster served (1) has one serving primary\n"},
		{"UPDATE pgcluster_nodes SET healthy = false WHERE name = 'pg1'", nil, exitNotOK,
			"local: 1 serving, 1 out; NO SERVING PRIMARY: primary.local has no address\n1 of 1 clusters served without exactly one serving primary\n"},
		{"UPDATE pgcluster_nodes SET healthy = true, heartbeat = now() - interval '1 hour' WHERE name = 'pg1'", nil, exitOK, "primary pg1"},
		{"", []string{"-stale-after", "10s"}, exitNotOK, "NO SERVING PRIMARY"},
		{"UPDATE pgcluster_nodes SET role = 'primary'", nil, exitNotOK, "SPLIT BRAIN: pg1, pg2 claim to be primary"},
	} {
		if step.sql != "" {
			reg.MustExec(t, step.sql)
		}
		code, out, errOut := status(t, append(args, step.args...)...)
		if code != step.code || !strings.Contains(out, step.want) {
			t.Errorf("after %q %v: exit %d, want %d with %q; output:\n%s%s", step.sql, step.args, code, step.code, step.want, out, errOut)
		}
		if !strings.Contains(out, "fleet    not read (no -redis)") {
			t.Errorf("without -redis the output does not say the checks were not read:\n%s", out)
		}
	}
	_, r := statusJSON(t, append(args, "-stale-after", "10s")...)
	if n := r.node("local", "pg1"); n.State != "out" || n.Reason != "stale" || !strings.Contains(n.Detail, "stale_after 10s") {
		t.Errorf("pg1 with an hour-old heartbeat and -stale-after 10s: %s (%s: %s), want out (stale)", n.State, n.Reason, n.Detail)
	}
}

// Errors say which flag is at fault and what to do, never show a password,
// and exit 2.
func TestStatusErrors(t *testing.T) {
	reg := registry(t)
	bare := pgtest.New(t) // no schema
	// Nothing listens on closed: connections to it are refused.
	closed, err := proc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	const pw = "s3cretPW"
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no command", nil, "usage: pgclusterctl status"},
		{"unknown command", []string{"stats"}, `unknown command "stats"`},
		{"no -postgres", []string{"status"}, "-postgres DSN is required"},
		{"argument", []string{"status", "-postgres", reg.DSN(""), "extra"}, `unexpected argument "extra"`},
		{"bad DSN", []string{"status", "-postgres", "postgres://dns:" + pw + "@127.0.0.1:99999/registry"}, "-postgres: the DSN cannot be used"},
		{"registry unreachable", []string{"status", "-postgres", fmt.Sprintf("postgres://dns:%s@127.0.0.1:%d/registry?connect_timeout=2", pw, closed)},
			fmt.Sprintf("-postgres: registry 127.0.0.1:%d/registry unreachable", closed)},
		{"no registry tables", []string{"status", "-postgres", bare.DSN("")}, "has no registry tables. To fix: apply schema.sql"},
		{"bad Redis URL", []string{"status", "-postgres", reg.DSN(""), "-redis", "http://:" + pw + "@127.0.0.1:6379"}, "-redis: the Redis URL cannot be used"},
		{"Redis unreachable", []string{"status", "-postgres", reg.DSN(""), "-redis", fmt.Sprintf("redis://:%s@127.0.0.1:%d", pw, closed)},
			fmt.Sprintf("-redis redis://127.0.0.1:%d: Redis does not answer (connection refused at 127.0.0.1:%d: no Redis listens there; check that Redis runs, and the host and port of the redis URL", closed, closed)},
		{"prefix without Redis", []string{"status", "-postgres", reg.DSN(""), "-prefix", "p:"}, "-prefix needs -redis"},
		{"interval", []string{"status", "-postgres", reg.DSN(""), "-watch", "-interval", "1ms"}, "-interval 1ms is below 100ms"},
		{"max lag", []string{"status", "-postgres", reg.DSN(""), "-max-lag", "lots"}, "-max-lag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut strings.Builder
			start := time.Now()
			code := run(context.Background(), tc.args, &out, &errOut)
			if code != exitFailed || !strings.Contains(errOut.String(), tc.want) {
				t.Errorf("exit %d, want %d with %q; stderr:\n%s", code, exitFailed, tc.want, errOut.String())
			}
			if strings.Contains(out.String()+errOut.String(), pw) {
				t.Errorf("the password is shown:\n%s%s", out.String(), errOut.String())
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("took %v", d)
			}
		})
	}
}

// -watch reports again every -interval, shows a change made meanwhile, and
// exits with the status of its last report once interrupted.
func TestStatusWatch(t *testing.T) {
	reg := registry(t)
	reg.MustExec(t, `INSERT INTO pgcluster_nodes (cluster, name, address, role) VALUES ('local', 'pg1', '192.0.2.1', 'primary')`)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, errOut := &proc.Buffer{}, &proc.Buffer{}
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"status", "-postgres", reg.DSN(""), "-watch", "-interval", "100ms", "-json"}, out, errOut)
	}()
	reports := func() []report {
		var rs []report
		for line := range strings.SplitSeq(out.String(), "\n") {
			var r report
			if json.Unmarshal([]byte(line), &r) == nil && len(r.Clusters) > 0 {
				rs = append(rs, r)
			}
		}
		return rs
	}
	if err := pgtest.WaitFor(10*time.Second, func() error {
		if rs := reports(); len(rs) < 2 || !rs[0].OK {
			return fmt.Errorf("%d reports", len(rs))
		}
		return nil
	}); err != nil {
		t.Fatalf("%v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	reg.MustExec(t, "UPDATE pgcluster_nodes SET healthy = false")
	if err := pgtest.WaitFor(10*time.Second, func() error {
		rs := reports()
		if last := rs[len(rs)-1]; last.OK || last.node("local", "pg1").Reason != "unhealthy" {
			return fmt.Errorf("last report: ok %v", last.OK)
		}
		return nil
	}); err != nil {
		t.Fatalf("the change is not reported: %v\nstdout:\n%s", err, out)
	}
	cancel()
	select {
	case code := <-done:
		if code != exitNotOK {
			t.Errorf("exit %d after the interrupt, want %d: the last report has no serving primary", code, exitNotOK)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("-watch did not stop when interrupted")
	}
}

// The table shows each node's region and zone, and the networks follow
// the clusters with the place of their clients.
func TestReportShowsPlaces(t *testing.T) {
	r := &report{Registry: "r", Zone: "z.", Clusters: []clusterReport{{Name: "local", Summary: "local: 1 serving",
		Nodes: []nodeReport{{Name: "pg1", Address: "192.0.2.1:5432", Region: "eu", Zone: "eu-a", State: "in"}, {Name: "pg2", Address: "192.0.2.2:5432", State: "in"}}}},
		Networks: []networkReport{{Network: "10.0.0.0/16", Region: "eu", Zone: "eu-a"}, {Network: "10.9.0.0/16", Zone: "b"}}}
	var b strings.Builder
	if err := r.write(&b, false, false, false); err != nil {
		t.Fatal(err)
	}
	text := b.String()
	for _, re := range []string{`(?m)^local +pg1 +192\.0\.2\.1:5432 +eu/eu-a `, `(?m)^local +pg2 +192\.0\.2\.2:5432 +-/- `} {
		if !regexp.MustCompile(re).MatchString(text) {
			t.Errorf("status lacks a row matching %s:\n%s", re, text)
		}
	}
	for _, want := range []string{"REGION/ZONE", "network 10.0.0.0/16: clients in eu/eu-a", "network 10.9.0.0/16: clients in -/b"} {
		if !strings.Contains(text, want) {
			t.Errorf("status lacks %q:\n%s", want, text)
		}
	}
}
