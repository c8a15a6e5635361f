package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// What the README's Security section names, and the test puts in place of
// its password placeholder.
const (
	readmeRole        = "pgcluster_dns"
	readmeDatabase    = "registry"
	readmeRedisUser   = "pgcluster"
	readmePlaceholder = "CHANGE-ME"
)

// TestSecurityLeastPrivilege runs the README's GRANT and ACL SETUSER lines
// as written (the password placeholder replaced) and runs a fleet of two
// bin/coredns with those credentials only: the PostgreSQL role, in a
// registry where PUBLIC keeps no right, logs in with its password, serves
// the zone and follows changes through LISTEN; the Redis user, limited to
// pgcluster's prefix, channel and commands, keeps the fleet coordinated
// through a flip and a graceful stop, and Redis refused it nothing (ACL
// LOG). Then the role cannot write the tables, read another table or
// create one, and the user cannot read, write, publish, script or
// administer outside the prefix.
func TestSecurityLeastPrivilege(t *testing.T) {
	const interval, timeout = 200 * time.Millisecond, 100 * time.Millisecond
	ctx := Ctx(t)
	grants, acls := readmeGrants(t), readmeACLs(t)
	pgPass, redisPass := coretest.RandomHex(12), coretest.RandomHex(12)

	pg := pgtest.New(t)
	pg.MustExec(t, "CREATE DATABASE "+readmeDatabase)
	reg := pgConnect(ctx, t, pg.DSN(readmeDatabase))
	mustExec(ctx, t, reg, pgcluster.Schema)
	// PUBLIC keeps nothing: every right of the role is one the README grants.
	mustExec(ctx, t, reg, "REVOKE ALL ON DATABASE "+readmeDatabase+" FROM PUBLIC")
	mustExec(ctx, t, reg, "REVOKE ALL ON SCHEMA public FROM PUBLIC")
	mustExec(ctx, t, reg, "CREATE TABLE other_data(secret text)")
	for _, stmt := range grants {
		mustExec(ctx, t, reg, strings.ReplaceAll(stmt, readmePlaceholder, pgPass))
	}
	if err := pg.PrependHBA(ctx, "host all "+readmeRole+" 127.0.0.0/8 scram-sha-256"); err != nil {
		t.Fatal(err)
	}
	var bs []*fleetBackend
	for i := range 3 {
		bs = append(bs, openFleetBackend(t, fmt.Sprintf("127.0.0.%d", 41+i)))
	}
	for i, b := range bs[:2] {
		mustExec(ctx, t, reg, fmt.Sprintf("INSERT INTO pgcluster_nodes(name, address, port, role) VALUES ('n%d', '%s', %s, 'standby')", i, b.host, b.port))
	}

	rs := redistest.Start(t)
	admin := rs.Client(t)
	for _, l := range acls {
		if err := runACL(ctx, admin, strings.ReplaceAll(l.line, readmePlaceholder, redisPass), l.since); err != nil {
			t.Fatalf("README line %q: %v", l.line, err)
		}
	}
	if err := admin.ACLLogReset(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	dsn := fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", readmeRole, pgPass, pg.Host, pg.Port, readmeDatabase)
	url := fmt.Sprintf("redis://%s:%s@%s", readmeRedisUser, redisPass, rs.Addr())
	ins := startInstances(t, securityCorefile(dsn, "check tcp", "interval "+interval.String(), "timeout "+timeout.String(),
		"rise 1", "fall 1", "redis "+url), 2)
	hosts := func(bs ...*fleetBackend) []string {
		var out []string
		for _, b := range bs {
			out = append(out, b.host)
		}
		return out
	}
	Eventually(t, 20*time.Second, coordinated(t, ins, 2))
	Eventually(t, 10*time.Second, answersExactly(ins, hosts(bs[0], bs[1])))

	// The registry's changes arrive (LISTEN needs no privilege).
	mustExec(ctx, t, reg, fmt.Sprintf("INSERT INTO pgcluster_nodes(name, address, port, role) VALUES ('n2', '%s', %s, 'standby')", bs[2].host, bs[2].port))
	Eventually(t, 10*time.Second, answersExactly(ins, hosts(bs...)))
	mustExec(ctx, t, reg, "UPDATE pgcluster_nodes SET healthy = false WHERE name = 'n1'")
	Eventually(t, 10*time.Second, answersExactly(ins, hosts(bs[0], bs[2])))
	mustExec(ctx, t, reg, "INSERT INTO pgcluster_aliases VALUES ('prod', 'local')")
	Eventually(t, 10*time.Second, func() error {
		for _, in := range ins {
			m, err := Exchange("udp", in.Addr(), "prod."+Zone, 1)
			if err != nil {
				return err
			}
			if len(Addrs(m)) != 2 {
				return fmt.Errorf("prod.%s from %s: %v", Zone, in.Addr(), m.Answer)
			}
		}
		return nil
	})
	// The fleet's statuses go through Redis: a flip reaches both, and a
	// graceful stop hands the leases over (release and leave).
	bs[0].Close()
	Eventually(t, 10*time.Second, answersExactly(ins, hosts(bs[2])))
	bs[0].Open(t)
	Eventually(t, 10*time.Second, answersExactly(ins, hosts(bs[0], bs[2])))
	leases := metric(t, ins[0], leasesMetric) + metric(t, ins[1], leasesMetric)
	if err := ins[1].Term(); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 20*time.Second, coordinated(t, ins[:1], int(leases)))
	if metric(t, ins[0], modeLocal) != 0 {
		t.Fatal("the instance went to local mode")
	}
	entries, err := admin.ACLLog(ctx, 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("Redis refused the fleet's user: %s %q (%s, by %s)", e.Reason, e.Object, e.Context, e.Username)
	}

	// The role: reads the registry tables, writes where an alias that
	// failed over points, nothing else.
	role := pgConnect(ctx, t, dsn)
	var n int
	if err := role.QueryRow(ctx, "SELECT count(*) FROM pgcluster_nodes").Scan(&n); err != nil || n != 3 {
		t.Fatalf("the role reads %d nodes, %v", n, err)
	}
	for _, stmt := range []string{
		"INSERT INTO pgcluster_nodes(name, address) VALUES ('x', '127.0.0.99')",
		"UPDATE pgcluster_nodes SET healthy = true",
		"DELETE FROM pgcluster_aliases",
		"UPDATE pgcluster_aliases SET fallback = '{}'",
		"DELETE FROM pgcluster_networks",
		"INSERT INTO pgcluster_drains(cluster, reason) VALUES ('local', 'maintenance')",
		"TRUNCATE pgcluster_nodes",
		"SELECT * FROM other_data",
		"CREATE TABLE mine(x int)",
		"CREATE TEMP TABLE mine(x int)",
	} {
		_, err := role.Exec(ctx, stmt)
		if pgErr := (*pgconn.PgError)(nil); !errors.As(err, &pgErr) || pgErr.Code != "42501" {
			t.Errorf("the role ran %q: %v; want permission denied (42501)", stmt, err)
		}
	}
	var privs string
	err = reg.QueryRow(ctx, `SELECT string_agg(table_name || ':' || privilege_type, ' ' ORDER BY table_name, privilege_type)
FROM information_schema.role_table_grants WHERE grantee = $1`, readmeRole).Scan(&privs)
	if want := "pgcluster_alias_state:DELETE pgcluster_alias_state:INSERT pgcluster_alias_state:SELECT pgcluster_alias_state:UPDATE pgcluster_aliases:SELECT pgcluster_drains:SELECT pgcluster_networks:SELECT pgcluster_nodes:SELECT"; err != nil || privs != want {
		t.Errorf("the role's table privileges: %q, %v; want %q", privs, err, want)
	}

	// The user: nothing outside the prefix, no other command.
	user := redis.NewClient(&redis.Options{Addr: rs.Addr(), Username: readmeRedisUser, Password: redisPass, ContextTimeoutEnabled: true})
	t.Cleanup(func() { user.Close() })
	prefix := defaultPrefix
	if err := user.Set(ctx, prefix+"{local/n0}:lease", "x", time.Second).Err(); err != nil {
		t.Fatalf("the user cannot write under its prefix: %v", err)
	}
	for what, err := range map[string]error{
		"SET other":                 user.Set(ctx, "other", "x", 0).Err(),
		"GET other":                 user.Get(ctx, "other").Err(),
		"DEL other":                 user.Del(ctx, "other").Err(),
		"SET under another prefix":  user.Set(ctx, "pgcluster:other.lan.:{local/n0}:lease", "x", 0).Err(),
		"EVAL on another key":       user.Eval(ctx, "return redis.call('SET', KEYS[1], 'x')", []string{"other"}).Err(),
		"EVAL reaching out":         user.Eval(ctx, "return redis.call('SET', 'other', 'x')", []string{prefix + "k"}).Err(),
		"PUBLISH another channel":   user.Publish(ctx, "other", "x").Err(),
		"SUBSCRIBE another channel": subscribeErr(ctx, user, "other"),
		"KEYS":                      user.Keys(ctx, "*").Err(),
		"FLUSHALL":                  user.FlushAll(ctx).Err(),
		"CONFIG GET":                user.ConfigGet(ctx, "*").Err(),
		"ACL LIST":                  user.ACLList(ctx).Err(),
		"SELECT 1":                  user.Do(ctx, "SELECT", "1").Err(),
	} {
		if err == nil || !strings.Contains(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "can't") {
			t.Errorf("the user ran %s: %v; want it refused", what, err)
		}
	}
	if v, err := admin.Exists(ctx, "other", "pgcluster:other.lan.:{local/n0}:lease").Result(); err != nil || v != 0 {
		t.Errorf("keys outside the prefix exist after the user's attempts: %d, %v", v, err)
	}
	if entries, err := admin.ACLLog(ctx, 100).Result(); err != nil || len(entries) == 0 {
		t.Errorf("ACL LOG holds %d entries after refusals, %v: the check of an empty log above proves nothing", len(entries), err)
	}
}

// subscribeErr subscribes to channel and returns the error of the
// subscription's confirmation.
func subscribeErr(ctx context.Context, c *redis.Client, channel string) error {
	ps := c.Subscribe(ctx, channel)
	defer ps.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err := ps.Receive(cctx)
	return err
}

// readmeSection returns the security guide's section under heading ("#
// Security", the whole page), up to the next section of the same level.
func readmeSection(t testing.TB, heading string) string {
	t.Helper()
	b, err := os.ReadFile("../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	s := "\n" + string(b)
	i := strings.Index(s, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("docs/security.md has no %q section", heading)
	}
	s = s[i+len(heading)+2:]
	if j := strings.Index(s, "\n## "); j >= 0 {
		s = s[:j]
	}
	return s
}

// readmeGrants returns the SQL statements of the README's Security
// section (its ~~~ sql blocks), comments dropped.
func readmeGrants(t testing.TB) []string {
	t.Helper()
	var out []string
	for _, b := range regexp.MustCompile("(?s)~~~ sql\n(.*?)~~~").FindAllStringSubmatch(readmeSection(t, "# Security"), -1) {
		sql := regexp.MustCompile(`--[^\n]*`).ReplaceAllString(b[1], "")
		for stmt := range strings.SplitSeq(sql, ";") {
			if stmt = strings.Join(strings.Fields(stmt), " "); stmt != "" {
				out = append(out, stmt)
			}
		}
	}
	if len(out) == 0 || !strings.Contains(strings.Join(out, "\n"), "GRANT SELECT") {
		t.Fatalf("README.md's Security section has no ~~~ sql block with the GRANT lines: %q", out)
	}
	return out
}

// aclLine is an ACL SETUSER line of the README, and the Redis version it
// needs ("" for any the README supports).
type aclLine struct{ line, since string }

// readmeACLs returns the ACL SETUSER lines of the README's Security
// section. A line that follows "Redis X.Y and later" needs that version.
func readmeACLs(t testing.TB) []aclLine {
	t.Helper()
	var out []aclLine
	since := regexp.MustCompile(`Redis (\d+\.\d+) and later`)
	for _, b := range regexp.MustCompile("(?s)(?:([^\n]*)\n\n)?~~~ txt\n(ACL SETUSER .*?)~~~").FindAllStringSubmatch(readmeSection(t, "# Security"), -1) {
		v := ""
		if m := since.FindStringSubmatch(b[1]); m != nil {
			v = m[1]
		}
		for l := range strings.SplitSeq(strings.TrimSpace(b[2]), "\n") {
			out = append(out, aclLine{strings.TrimSpace(l), v})
		}
	}
	if len(out) == 0 {
		t.Fatal("README.md's Security section has no ~~~ txt block of ACL SETUSER lines")
	}
	return out
}

// runACL runs an ACL SETUSER line; one that needs a later Redis than the
// server's must be refused as unknown there instead.
func runACL(ctx context.Context, admin *redis.Client, line, since string) error {
	var args []any
	for _, f := range strings.Fields(line) {
		args = append(args, f)
	}
	err := admin.Do(ctx, args...).Err()
	if since == "" {
		return err
	}
	info, ierr := admin.Info(ctx, "server").Result()
	if ierr != nil {
		return ierr
	}
	version := regexp.MustCompile(`redis_version:(\d+)\.(\d+)`).FindStringSubmatch(info)
	var have, need [2]int
	fmt.Sscanf(version[1]+" "+version[2], "%d %d", &have[0], &have[1])
	fmt.Sscanf(strings.Replace(since, ".", " ", 1), "%d %d", &need[0], &need[1])
	if have[0] > need[0] || have[0] == need[0] && have[1] >= need[1] {
		return err
	}
	if err == nil || !strings.Contains(err.Error(), "Unknown command") {
		return fmt.Errorf("Redis %s.%s accepted a line for Redis %s and later, or refused it for another reason: %v", version[1], version[2], since, err)
	}
	return nil
}

// pgConnect connects to dsn for the test.
func pgConnect(ctx context.Context, t testing.TB, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func mustExec(ctx context.Context, t testing.TB, conn *pgx.Conn, sql string) {
	t.Helper()
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}
