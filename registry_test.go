package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

func TestHeartbeatAge(t *testing.T) {
	const year = 365.25 * 24 * 3600
	tests := []struct {
		seconds float64
		want    time.Duration
	}{
		{0, 0},
		{1.5, 1500 * time.Millisecond},
		{-2, -2 * time.Second},
		{100 * year, time.Duration(100 * year * 1e9)},
		{-75 * year, time.Duration(-75 * year * 1e9)},    // '2100-01-01': within range
		{325 * year, math.MaxInt64},                      // '1700-01-01'
		{2025 * year, math.MaxInt64},                     // '0001-01-01'
		{6738 * year, math.MaxInt64},                     // '4713-01-01 BC'
		{-292278 * year, math.MinInt64},                  // the far future
		{math.MaxInt64 / 1e9 * 2, math.MaxInt64},         // just past the range
		{math.Inf(1), math.MaxInt64},                     // '-infinity'
		{math.Inf(-1), math.MinInt64},                    // 'infinity'
		{math.NaN(), math.MaxInt64},                      // not a number: ancient
		{math.MaxFloat64, math.MaxInt64},                 // overflows the product
		{-math.MaxFloat64, math.MinInt64},                // and the other way
		{float64(math.MaxInt64) / 1e9, math.MaxInt64},    // exactly 2^63 ns
		{float64(math.MinInt64) / 1e9, math.MinInt64},    // exactly -2^63 ns
		{float64(1<<62) / 1e9, time.Duration(1 << 62)},   // large, exact
		{-float64(1<<62) / 1e9, -time.Duration(1 << 62)}, // large negative, exact
	}
	for _, tc := range tests {
		if got := heartbeatAge(tc.seconds); got != tc.want {
			t.Errorf("heartbeatAge(%g) = %d, want %d", tc.seconds, got, tc.want)
		}
	}
}

func TestNextReload(t *testing.T) {
	r := &registry{set: &settings{refresh: 30 * time.Second, staleAfter: 10 * time.Second}}
	tests := []struct {
		ages []time.Duration
		want time.Duration
	}{
		{nil, 30 * time.Second},
		{[]time.Duration{4 * time.Second}, 6*time.Second + time.Millisecond},
		{[]time.Duration{11 * time.Second}, 30 * time.Second},                  // stale for good
		{[]time.Duration{math.MaxInt64}, 30 * time.Second},                     // ancient
		{[]time.Duration{math.MinInt64}, 30 * time.Second},                     // 'infinity': comes within stale_after never
		{[]time.Duration{-15 * time.Second}, 5*time.Second + time.Millisecond}, // in the future, within reach
		{[]time.Duration{-5 * time.Second}, 15*time.Second + time.Millisecond}, // slightly in the future: stale later
		{[]time.Duration{math.MinInt64, 9 * time.Second, math.MaxInt64}, time.Second + time.Millisecond},
	}
	now := time.Now()
	for _, tc := range tests {
		var nodes []Node
		for _, a := range tc.ages {
			nodes = append(nodes, Node{HeartbeatAge: a})
		}
		// Ages measured a second ago are a second older now.
		r.rows.clusters = map[string]clusterRows{"c": {nodes: nodes, at: now.Add(-time.Second)}}
		if got := r.nextReload(now.Add(-time.Second)); got != tc.want {
			t.Errorf("nextReload(%v) = %v, want %v", tc.ages, got, tc.want)
		}
		if got, want := r.nextReload(now), tc.want-time.Second; tc.want < 30*time.Second && got != want {
			t.Errorf("a second later, nextReload(%v) = %v, want %v", tc.ages, got, want)
		}
	}
	r.set.staleAfter = 0
	r.rows.clusters = map[string]clusterRows{"c": {nodes: []Node{{HeartbeatAge: math.MinInt64}}, at: now}}
	if got := r.nextReload(now); got != r.set.refresh {
		t.Errorf("without stale_after: %v, want the refresh interval", got)
	}
}

// oldSchema makes the registry as an older schema.sql did: without the
// checks that refuse infinite heartbeats and network addresses.
const oldSchema = `ALTER TABLE pgcluster_nodes DROP CONSTRAINT IF EXISTS pgcluster_nodes_heartbeat_finite;
ALTER TABLE pgcluster_nodes DROP CONSTRAINT IF EXISTS pgcluster_nodes_address_host;`

// TestRegistryOddRows loads, from a real registry made by an older schema,
// rows whose heartbeats are ancient, far in the future or infinite, and an
// address that names a network: the load succeeds with every row, ages
// clamped. Applying schema.sql again to that registry succeeds (twice) and
// refuses such rows from then on.
func TestRegistryOddRows(t *testing.T) {
	pg := pgtest.New(t)
	pg.MustExec(t, Schema)
	pg.MustExec(t, oldSchema)
	pg.MustExec(t, `INSERT INTO pgcluster_nodes(cluster, name, address, heartbeat) VALUES
  ('c', 'fresh', '192.0.2.1', now()),
  ('c', 'year1', '192.0.2.2', '0001-01-01'),
  ('c', 'y1700', '192.0.2.3', '1700-01-01'),
  ('c', 'bc', '192.0.2.4', '4713-01-01 BC'),
  ('c', 'y2100', '192.0.2.5', '2100-01-01'),
  ('c', 'inf', '192.0.2.6', 'infinity'),
  ('c', 'neginf', '192.0.2.7', '-infinity'),
  ('c', 'net', '10.1.0.0/16', now()),
  ('c', 'six', '2001:db8::1', now())`)
	for range 2 {
		pg.MustExec(t, Schema)
	}
	ctx := context.Background()
	for _, bad := range []string{
		`INSERT INTO pgcluster_nodes(cluster, name, address, heartbeat) VALUES ('c', 'x', '192.0.2.9', 'infinity')`,
		`INSERT INTO pgcluster_nodes(cluster, name, address, heartbeat) VALUES ('c', 'x', '192.0.2.9', '-infinity')`,
		`INSERT INTO pgcluster_nodes(cluster, name, address) VALUES ('c', 'x', '10.1.0.0/16')`,
		`INSERT INTO pgcluster_nodes(cluster, name, address) VALUES ('c', 'x', '2001:db8::/64')`,
		`UPDATE pgcluster_nodes SET heartbeat = 'infinity' WHERE name = 'fresh'`,
	} {
		var pgErr *pgconn.PgError
		if err := pg.Exec(ctx, bad); !errors.As(err, &pgErr) || pgErr.Code != "23514" {
			t.Errorf("%s: %v, want a check violation (23514)", bad, err)
		}
	}

	var got []Node
	r := newRegistry(&settings{dsn: pg.DSN(""), refresh: time.Hour, staleAfter: 10 * time.Second, zones: []string{"test."}}, "", func(u rowsUpdate) {
		for _, ns := range u.nodes {
			got = append(got, ns...)
		}
	})
	conn, err := pgx.Connect(ctx, pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := r.load(ctx, conn, nil); err != nil {
		t.Fatalf("load: %v", err)
	}
	byName := map[string]Node{}
	for _, n := range got {
		byName[n.Name] = n
	}
	if len(byName) != 9 {
		t.Fatalf("loaded %d nodes, want all 9: %v", len(byName), got)
	}
	const year = 365 * 24 * time.Hour
	for name, want := range map[string]func(time.Duration) bool{
		"fresh":  func(a time.Duration) bool { return a >= 0 && a < time.Minute },
		"year1":  func(a time.Duration) bool { return a == math.MaxInt64 },
		"y1700":  func(a time.Duration) bool { return a == math.MaxInt64 },
		"bc":     func(a time.Duration) bool { return a == math.MaxInt64 },
		"y2100":  func(a time.Duration) bool { return a < -60*year && a > -100*year },
		"inf":    func(a time.Duration) bool { return a == math.MinInt64 },
		"neginf": func(a time.Duration) bool { return a == math.MaxInt64 },
	} {
		if a := byName[name].HeartbeatAge; !want(a) {
			t.Errorf("%s: heartbeat age %d (%v)", name, a, a)
		}
	}
	for name, want := range map[string]struct {
		addr, network string
	}{"fresh": {"192.0.2.1", "invalid Prefix"}, "net": {"10.1.0.0", "10.1.0.0/16"}, "six": {"2001:db8::1", "invalid Prefix"}} {
		if n := byName[name]; n.Address.String() != want.addr || n.Network.String() != want.network {
			t.Errorf("%s: address %s network %s, want %s network %s", name, n.Address, n.Network, want.addr, want.network)
		}
	}
	var notValid int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_constraint WHERE conrelid = 'pgcluster_nodes'::regclass
AND conname IN ('pgcluster_nodes_heartbeat_finite', 'pgcluster_nodes_address_host') AND NOT convalidated`).Scan(&notValid); err != nil {
		t.Fatal(err)
	}
	if notValid != 2 {
		t.Errorf("%d NOT VALID checks on the old registry, want 2", notValid)
	}
}

func TestDiagnose(t *testing.T) {
	_, parseErr := pgconn.ParseConfig("postgres://u:s3cret@host:notaport/db")
	if parseErr == nil {
		t.Fatal("the test DSN parses")
	}
	pgErr := func(code string) error {
		return fmt.Errorf("read pgcluster_nodes: %w", &pgconn.PgError{Severity: "ERROR", Code: code, Message: "m"})
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &net.AddrError{Err: "x"}}
	tests := []struct {
		err        error
		what, todo string
	}{
		{pgErr("42501"), "permission denied", `GRANT SELECT ON pgcluster_nodes, pgcluster_aliases, pgcluster_networks, pgcluster_drains TO "dns"`},
		{pgErr("42P01"), "no registry tables", "apply schema.sql"},
		{pgErr("42703"), "older than this version", "apply schema.sql, or ALTER TABLE"},
		{pgErr("28P01"), "refuses the login", "user and password"},
		{pgErr("28000"), "refuses the login", "pg_hba.conf"},
		{pgErr("3D000"), "no such database", "database name"},
		{pgErr("22P02"), "data this version cannot read", "fix or delete the row"},
		{pgErr("22008"), "data this version cannot read", "fix or delete the row"},
		{pgErr("53300"), "too many connections", "max_connections"},
		{pgErr("57P03"), "starting up", "retrying"},
		{pgErr("57P01"), "unreachable", "retrying"},
		{pgErr("57014"), "cancelled a registry query", "statement_timeout"},
		{pgErr("55P03"), "past lock_timeout", "pg_locks"},
		{pgErr("XX000"), "SQLSTATE XX000", "retrying"},
		{parseErr, "DSN that cannot be parsed", "postgres option"},
		{fmt.Errorf("read pgcluster_nodes: %w", pgx.ScanArgError{ColumnIndex: 3, FieldName: "port", Err: errors.New("x")}), "type", "schema.sql"},
		{fmt.Errorf("connect: %w", syscall.ECONNREFUSED), "unreachable", "PostgreSQL runs"},
		{refused, "unreachable", "host and port"},
		{&net.DNSError{Err: "no such host", Name: "db.example", IsNotFound: true}, "unreachable", "host and port"},
		{fmt.Errorf("no answer to a ping within 2s: %w", context.DeadlineExceeded), "unreachable", "retrying"},
		{errors.New("something else"), "failed", "retrying"},
	}
	for _, tc := range tests {
		p := diagnose(tc.err, "dns")
		if !strings.Contains(p.what, tc.what) || !strings.Contains(p.todo, tc.todo) {
			t.Errorf("diagnose(%v) = %+v, want what ~ %q, todo ~ %q", tc.err, p, tc.what, tc.todo)
		}
		if tc.what != "unreachable" && strings.Contains(p.what, "unreachable") {
			t.Errorf("diagnose(%v) says unreachable", tc.err)
		}
	}
	if p := diagnose(pgErr("42501"), ""); !strings.Contains(p.todo, "TO the DSN's user") {
		t.Errorf("no user: %q", p.todo)
	}
}

// A registry query cancelled by statement_timeout, or refused a lock by
// lock_timeout, is logged as such, with what to look at: the server runs
// and answers, it is not unreachable. Once the lock is gone, the follower
// loads.
func TestRegistryQueryTimeouts(t *testing.T) {
	pg := pgtest.New(t)
	pg.MustExec(t, Schema)
	pg.MustExec(t, `INSERT INTO pgcluster_nodes(cluster, name, address) VALUES ('c', 'n', '192.0.2.1');
CREATE ROLE dns_statement LOGIN; ALTER ROLE dns_statement SET statement_timeout = '200ms';
CREATE ROLE dns_lock LOGIN; ALTER ROLE dns_lock SET lock_timeout = '200ms';
GRANT SELECT ON pgcluster_nodes, pgcluster_aliases TO dns_statement, dns_lock;`)
	// An operator's ALTER TABLE left open: every read of the table waits.
	ctx := context.Background()
	locker, err := pgx.Connect(ctx, pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	if _, err := locker.Exec(ctx, "BEGIN; LOCK TABLE pgcluster_nodes IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	logs := captureLog(t)
	var loaded []chan struct{}
	for _, tc := range []struct{ user, want, todo string }{
		{"dns_statement", "cancelled a registry query (statement_timeout, or a cancel request)", `reset statement_timeout for "dns_statement"`},
		{"dns_lock", "holds a lock on a registry table past lock_timeout", "look in pg_locks"},
	} {
		set := &settings{refresh: time.Hour, dsn: fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable", tc.user, pg.HostPort()), zones: []string{testZone}}
		r := newRegistry(set, "", func(rowsUpdate) {})
		rctx, cancel := context.WithCancel(ctx)
		go r.run(rctx)
		t.Cleanup(func() { cancel(); <-r.done })
		loaded = append(loaded, r.loaded)
		if err := pgtest.WaitFor(10*time.Second, func() error {
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, tc.want) && strings.Contains(line, tc.todo) {
					if strings.Contains(line, "unreachable") {
						return fmt.Errorf("%s: says unreachable: %s", tc.user, line)
					}
					return nil
				}
			}
			return fmt.Errorf("%s: no log line %q", tc.user, tc.want)
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := locker.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	for i, l := range loaded {
		select {
		case <-l:
		case <-time.After(15 * time.Second):
			t.Fatalf("follower %d did not load within 15s of the lock's release", i)
		}
	}
}

func TestDownMessage(t *testing.T) {
	p := problem{"denies access to the registry tables (permission denied)", "GRANT SELECT ON pgcluster_nodes, pgcluster_aliases TO \"dns\""}
	before := downMessage("127.0.0.1:5432/postgres", p, false, "ERROR: permission denied")
	after := downMessage("127.0.0.1:5432/postgres", p, true, "ERROR: permission denied")
	for _, tc := range []struct {
		msg          string
		want, refuse string
	}{
		{before, "no snapshot yet: the zone answers SERVFAIL and is not ready until the registry loads", "last snapshot"},
		{after, "answers keep coming from the last snapshot", "SERVFAIL"},
	} {
		if !strings.Contains(tc.msg, tc.want) || strings.Contains(tc.msg, tc.refuse) {
			t.Errorf("%q: want %q, not %q", tc.msg, tc.want, tc.refuse)
		}
		for _, part := range []string{"Registry 127.0.0.1:5432/postgres denies access", "To fix: GRANT SELECT", "Error: ERROR: permission denied"} {
			if !strings.Contains(tc.msg, part) {
				t.Errorf("%q lacks %q", tc.msg, part)
			}
		}
	}
}

// TestErrTextRedacts: the password is never in a logged error, not even in
// an unparsable DSN's.
func TestErrTextRedacts(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u:s3cret@host:notaport/db",
		"postgres://u:s3cret@host/db?sslmode=bogus",
		"host=h password=s3cret port=notaport",
		"password=s3cret not-a-pair",
	} {
		_, err := pgconn.ParseConfig(dsn)
		if err == nil {
			t.Fatalf("%q parses", dsn)
		}
		if got := errText(err, dsn); strings.Contains(got, "s3cret") || !strings.Contains(got, "cannot parse the DSN") {
			t.Errorf("%q: %q", dsn, got)
		}
		if got := redact(dsn); strings.Contains(got, "s3cret") {
			t.Errorf("redact(%q) = %q", dsn, got)
		}
	}
	dsn := "postgres://u:s3cret@127.0.0.1:1/db"
	if got := errText(fmt.Errorf("server said s3cret"), dsn); strings.Contains(got, "s3cret") {
		t.Errorf("password not masked: %q", got)
	}
}

func TestLastLoads(t *testing.T) {
	s := &loadStore{entries: map[string]*storeEntry{}}
	a, b := storeKey("dsn-a", []string{"z."}), storeKey("dsn-b", []string{"z."})
	nodes := []Node{{Cluster: "c", Name: "n"}}
	at := time.Now()

	// Caddy's order: the new instance starts, then the old one stops.
	if s.use(a) != nil {
		t.Fatal("a fresh store has a load")
	}
	rows := rowSet{clusters: map[string]clusterRows{"c": {nodes: nodes, at: at}}}
	s.keep(a, rows, at)
	if l := s.use(a); l == nil || l.rows.clusters["c"].nodes[0].Name != "n" || !l.loadedAt.Equal(at) {
		t.Fatalf("new instance: %+v", l)
	}
	s.release(a)

	// The other order: the old instance stops first.
	s.release(a)
	if l := s.use(a); l == nil || l.rows.clusters["c"].nodes[0].Name != "n" {
		t.Fatalf("new instance after the old one stopped: %+v", l)
	}

	// Reloads that change the DSN each time do not pile up entries.
	key := a
	for i := range 20 {
		next := storeKey(fmt.Sprintf("dsn-%d", i), []string{"z."})
		s.use(next)
		s.keep(next, rows, at)
		s.release(key)
		key = next
		if n := len(s.entries); n > 2 {
			t.Fatalf("reload %d: %d entries", i, n)
		}
	}
	s.use(b)
	if n := len(s.entries); n != 2 { // key's and b's
		t.Errorf("%d entries, want 2", n)
	}
	if storeKey("dsn", []string{"a.", "b."}) == storeKey("dsn", []string{"a."}) {
		t.Error("zones are part of the key")
	}
}
