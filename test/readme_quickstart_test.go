package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/docblock"
	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// What the README's quick start names and the test puts elsewhere: the
// port its Corefile listens on and its dig lines ask, and the registry's
// address in its DSN (a PostgreSQL of the test's own, on a free port).
const (
	quickstartReadme   = "../README.md"
	quickstartDNSPort  = "1053"
	quickstartRegistry = "127.0.0.1:5432"
)

// TestReadmeQuickStart follows the README's "Use it with your own cluster"
// as a reader would, copy-pasting its lines, read from the README's marked
// blocks: createdb and schema.sql through psql, the rows, the read-only
// role and its pg_hba.conf line (password checked: PUBLIC keeps no right on
// the registry), the Corefile run by the built bin/coredns with the run
// line's environment, and the dig lines, whose answers must be the ones the
// README shows. Then the heartbeat and fail-over statements, with the dig
// the README shows after them; the Patroni callback and the cron line, run
// by sh as a node named by hostname would; and the monitor role, its
// pg_hba.conf line and the check Corefile, which must find a real
// PostgreSQL up as primary while PUBLIC may not even connect.
func TestReadmeQuickStart(t *testing.T) {
	// Longer than Ctx's minute: the steps include starting two race-built
	// instances, which a loaded machine can take most of a minute over.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	block := func(name string) string {
		t.Helper()
		b, err := docblock.Read(quickstartReadme, name)
		if err != nil {
			t.Fatal(err)
		}
		return b.Text
	}
	pg := pgtest.New(t)
	pgEnv := append(os.Environ(), "PGHOST="+pg.Host, fmt.Sprint("PGPORT=", pg.Port), "PGUSER=postgres")

	// The registry, as the README makes it, from the checkout's root.
	shell(t, "..", pgEnv, block("quickstart-schema"))
	reg := pgConnect(ctx, t, pg.DSN("registry"))
	mustExec(ctx, t, reg, "REVOKE ALL ON DATABASE registry FROM PUBLIC")
	mustExec(ctx, t, reg, "REVOKE ALL ON SCHEMA public FROM PUBLIC")
	execAll(ctx, t, reg, block("quickstart-rows"))
	execAll(ctx, t, reg, block("quickstart-role"))
	if err := pg.PrependHBA(ctx, hbaLines(block("quickstart-hba"))...); err != nil {
		t.Fatal(err)
	}

	corefile := quickstartCorefile(t, block("quickstart-corefile"), pg)
	for name, value := range runEnv(t, block("quickstart-run")) {
		t.Setenv(name, value)
	}
	start := time.Now()
	coreDNSBuild.Binary(t)
	t.Logf("bin/coredns built in %.1fs", time.Since(start).Seconds())
	start = time.Now()
	in := StartFleetInstance(t, corefile)
	t.Logf("bin/coredns answered %.1fs after its start", time.Since(start).Seconds())
	port := in.Addr()[strings.LastIndex(in.Addr(), ":")+1:]
	digs := consoleSessions(t, block("quickstart-dig"))
	for _, s := range digs {
		Eventually(t, 10*time.Second, s.check(port))
	}

	// Keeping it current: a heartbeat, a fail-over, and the dig after it.
	for _, stmt := range statements(block("quickstart-write")) {
		tag, err := reg.Exec(ctx, stmt)
		if err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
		if tag.RowsAffected() == 0 {
			t.Errorf("%s: changed no row of the quick start's", stmt)
		}
	}
	for _, s := range consoleSessions(t, block("quickstart-dig-failover")) {
		Eventually(t, 10*time.Second, s.check(port))
	}

	// The Patroni callback, on pg1 when Patroni promotes it again: the
	// primary is pg1's once more, as the first dig shows it.
	script := filepath.Join(t.TempDir(), "pgcluster.sh")
	if err := os.WriteFile(script, []byte(block("quickstart-patroni")), 0o755); err != nil {
		t.Fatal(err)
	}
	nodeEnv := func(node string) []string {
		return append(hostnameShim(t, node), "PGCLUSTER_REGISTRY="+pg.DSN("registry"))
	}
	run := exec.Command(script, "on_role_change", "primary", "main")
	run.Env = nodeEnv("pg1")
	if out, err := run.CombinedOutput(); err != nil {
		t.Fatalf("the Patroni callback: %v\n%s", err, out)
	}
	primary := digs[len(digs)-1]
	if !strings.Contains(primary.command, "primary.") {
		t.Fatalf("the quick start's last dig asks %q, want the primary", primary.command)
	}
	Eventually(t, 10*time.Second, primary.check(port))
	var primaries int
	if err := reg.QueryRow(ctx, "SELECT count(*) FROM pgcluster_nodes WHERE cluster = 'main' AND role = 'primary'").Scan(&primaries); err != nil || primaries != 1 {
		t.Errorf("after the Patroni callback: %d primaries (%v), want 1", primaries, err)
	}

	// The cron line, as cron runs its command on pg3: pg3's heartbeat moves.
	mustExec(ctx, t, reg, "UPDATE pgcluster_nodes SET heartbeat = '2000-01-01' WHERE cluster = 'main' AND name = 'pg3'")
	shell(t, t.TempDir(), nodeEnv("pg3"), cronCommand(t, block("quickstart-cron")))
	var fresh bool
	if err := reg.QueryRow(ctx, "SELECT heartbeat > now() - interval '1 minute' FROM pgcluster_nodes WHERE cluster = 'main' AND name = 'pg3'").Scan(&fresh); err != nil || !fresh {
		t.Errorf("the cron line did not write pg3's heartbeat (%v)", err)
	}

	// The monitor role, on a server where PUBLIC may not connect: the check
	// Corefile finds that server up, as a primary.
	pg.MustExec(t, "REVOKE CONNECT ON DATABASE postgres FROM PUBLIC")
	monitor := block("quickstart-monitor")
	pg.MustExec(t, monitor)
	if err := pg.PrependHBA(ctx, hbaLines(block("quickstart-monitor-hba"))...); err != nil {
		t.Fatal(err)
	}
	password := regexp.MustCompile(`PASSWORD '([^']*)'`).FindStringSubmatch(monitor)
	if password == nil {
		t.Fatalf("the monitor role has no PASSWORD '...':\n%s", monitor)
	}
	t.Setenv("MONITOR_PASSWORD", password[1])
	mustExec(ctx, t, reg, fmt.Sprintf("INSERT INTO pgcluster_nodes (cluster, name, address, port, role) VALUES ('checked', 'pg', '%s', %d, 'standby')", pg.Host, pg.Port))
	checked := StartFleetInstance(t, quickstartCorefile(t, block("quickstart-check"), pg))
	Eventually(t, 15*time.Second, func() error {
		m, err := Exchange("udp", checked.Addr(), "pg.checked."+Zone, dns.TypeTXT)
		if err != nil {
			return err
		}
		txt := fmt.Sprint(m.Answer)
		if !strings.Contains(txt, "check=postgres up") || !strings.Contains(txt, "check_role=primary") {
			return fmt.Errorf("TXT of pg.checked.%s: %s", Zone, txt)
		}
		return nil
	})
}

// quickstartCorefile is a Corefile of the README with the test's port and
// registry in place of the README's.
func quickstartCorefile(t *testing.T, text string, pg *pgtest.Postgres) string {
	t.Helper()
	if strings.Count(text, ":"+quickstartDNSPort+" {") != 1 || strings.Count(text, quickstartRegistry) != 1 {
		t.Fatalf("the README's Corefile does not listen on :%s or name the registry at %s once:\n%s", quickstartDNSPort, quickstartRegistry, text)
	}
	text = strings.Replace(text, ":"+quickstartDNSPort+" {", ":"+PortPlaceholder+" {", 1)
	return strings.Replace(text, quickstartRegistry, pg.HostPort(), 1)
}

// runEnv reads the README's run line, NAME=VALUE ... bin/coredns -conf
// Corefile: the environment it gives the instance.
func runEnv(t *testing.T, line string) map[string]string {
	t.Helper()
	env := map[string]string{}
	fields := strings.Fields(line)
	for len(fields) > 0 && strings.Contains(fields[0], "=") {
		name, value, _ := strings.Cut(fields[0], "=")
		env[name] = value
		fields = fields[1:]
	}
	if strings.Join(fields, " ") != "bin/coredns -conf Corefile" {
		t.Fatalf("the README's run line is %q, want NAME=VALUE... bin/coredns -conf Corefile", line)
	}
	return env
}

// consoleSession is one command of a README console block and the output
// shown under it.
type consoleSession struct {
	command string
	want    []string
}

// consoleSessions splits a console block into its $ commands and their
// outputs.
func consoleSessions(t *testing.T, text string) []consoleSession {
	t.Helper()
	var out []consoleSession
	for _, l := range strings.Split(strings.TrimSpace(text), "\n") {
		if cmd, ok := strings.CutPrefix(l, "$ "); ok {
			out = append(out, consoleSession{command: cmd})
		} else if len(out) > 0 {
			out[len(out)-1].want = append(out[len(out)-1].want, l)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no $ command in the console block:\n%s", text)
	}
	return out
}

// check runs the session's dig line against the instance on port, dig
// being told the port the README's line names, and compares its answer
// with the README's: records in any order (addresses rotate), the TTL
// column as the README shows it, whitespace as one blank.
func (s consoleSession) check(port string) func() error {
	return func() error {
		if !strings.HasPrefix(s.command, "dig ") || strings.Count(s.command, "-p "+quickstartDNSPort+" ") != 1 {
			return fmt.Errorf("%q: want a dig line asking port %s", s.command, quickstartDNSPort)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		line := strings.Replace(s.command, "-p "+quickstartDNSPort+" ", "-p "+port+" ", 1)
		out, err := exec.CommandContext(ctx, "sh", "-c", line+" +time=1 +tries=1").CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %v\n%s", line, err, out)
		}
		got, want := normalise(string(out)), normalise(strings.Join(s.want, "\n"))
		if !slices.Equal(got, want) {
			return fmt.Errorf("%s printed\n%s\nthe README shows\n%s", line, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		return nil
	}
}

// normalise returns dig's output lines, blanks collapsed, sorted.
func normalise(out string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l = strings.Join(strings.Fields(l), " "); l != "" {
			lines = append(lines, l)
		}
	}
	slices.Sort(lines)
	return lines
}

// statements splits an SQL block into its statements, comments dropped.
func statements(sql string) []string {
	var out []string
	sql = regexp.MustCompile(`--[^\n]*`).ReplaceAllString(sql, "")
	for stmt := range strings.SplitSeq(sql, ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			out = append(out, stmt)
		}
	}
	return out
}

// execAll runs every statement of an SQL block.
func execAll(ctx context.Context, t *testing.T, conn *pgx.Conn, sql string) {
	t.Helper()
	for _, stmt := range statements(sql) {
		mustExec(ctx, t, conn, stmt)
	}
}

// hbaLines are the lines of a pg_hba.conf block.
func hbaLines(text string) []string {
	return strings.Split(strings.TrimSpace(text), "\n")
}

// cronCommand is the command of the README's one cron.d line: what follows
// the five time fields and the user.
func cronCommand(t *testing.T, text string) string {
	t.Helper()
	m := regexp.MustCompile(`^(\S+\s+){5}\S+\s+(.*)$`).FindStringSubmatch(strings.TrimSpace(text))
	if m == nil || strings.Contains(strings.TrimSpace(text), "\n") {
		t.Fatalf("not one cron.d line (five time fields, a user, a command):\n%s", text)
	}
	return m[2]
}

// hostnameShim returns this environment with a hostname command first in
// PATH that names node, as it would on that node.
func hostnameShim(t *testing.T, node string) []string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hostname"), []byte("#!/bin/sh\necho "+node+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return append(os.Environ(), "PATH="+dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// shell runs script with sh -e in dir, failing the test with its output.
func shell(t *testing.T, dir string, env []string, script string) {
	t.Helper()
	cmd := exec.Command("sh", "-e", "-c", script)
	cmd.Dir, cmd.Env = dir, env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sh -e -c %q: %v\n%s", script, err, out)
	}
}
