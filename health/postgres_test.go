package health

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

const pgOptions = "user=postgres dbname=postgres"

func pgAddr(pg *pgtest.Postgres) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(pg.Port))
}

// A real primary is Up with role primary and its WAL position; stopped, it is
// Down because the connection is refused; started again, it is Up again.
func TestPostgresUpPrimaryDownRefused(t *testing.T) {
	pg := pgtest.New(t)
	var observed sync.Map // cause -> true
	c := mustNew(t, Config{Check: CheckPostgres, Options: pgOptions, Interval: 100 * time.Millisecond, Timeout: time.Second,
		Observe: func(check, cause string, d time.Duration) {
			if check != CheckPostgres || d <= 0 {
				t.Errorf("Observe(%q, %q, %v): want check postgres and a duration", check, cause, d)
			}
			observed.Store(cause, true)
		}})
	c.SetTargets([]Target{{"c/pg", pgAddr(pg)}})
	rec, _ := start(t, c, 0)
	v := rec.waitVerdict("c/pg", 10*time.Second, isState(Up, CauseOK))
	if v.Role != RolePrimary || v.WAL == 0 {
		t.Errorf("Up verdict %+v: want role primary and a WAL position", v)
	}
	if cur := currentWAL(t, pg); v.WAL > cur {
		t.Errorf("WAL %X read by the probe is past the server's current %X", v.WAL, cur)
	}

	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	v = rec.waitVerdict("c/pg", 10*time.Second, isState(Down, CauseRefused))
	if v.Detail == "" || len(v.Detail) > maxDetail {
		t.Errorf("Down detail %q: want the error, at most %d bytes", v.Detail, maxDetail)
	}
	if v.Role != RolePrimary {
		t.Errorf("Down verdict role %q: want the last role read kept", v.Role)
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	rec.waitVerdict("c/pg", 10*time.Second, isState(Up, CauseOK))
	for _, cause := range []string{CauseOK, CauseRefused} {
		if _, ok := observed.Load(cause); !ok {
			t.Errorf("Observe never saw cause %q", cause)
		}
	}
}

// currentWAL reads pg_current_wal_lsn() as a number.
func currentWAL(t *testing.T, pg *pgtest.Postgres) uint64 {
	t.Helper()
	var s string
	query(t, pg, func(conn *pgx.Conn) error {
		return conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&s)
	})
	n, err := parseLSN(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func query(t *testing.T, pg *pgtest.Postgres, f func(*pgx.Conn) error) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if err := f(conn); err != nil {
		t.Fatal(err)
	}
}

// probe runs the postgres probe once, as a Checker would.
func probe(opts string, timeout time.Duration, addr netip.AddrPort) (result, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	began := time.Now()
	r := postgresProbe(opts, timeout, netip.Addr{})(ctx, addr)
	return r, time.Since(began)
}

// Each cause the postgres check names, provoked for real.
func TestPostgresCauses(t *testing.T) {
	pg := pgtest.New(t)
	pg.MustExec(t, "CREATE ROLE nologin NOLOGIN; CREATE ROLE pwuser LOGIN PASSWORD 'right'")
	// pgtest trusts every local connection: ask for a password from pwuser.
	var hba string
	query(t, pg, func(conn *pgx.Conn) error {
		return conn.QueryRow(context.Background(), "SHOW hba_file").Scan(&hba)
	})
	old, err := os.ReadFile(hba)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hba, append([]byte("host all pwuser 127.0.0.1/32 scram-sha-256\n"), old...), 0); err != nil {
		t.Fatal(err)
	}
	pg.MustExec(t, "SELECT pg_reload_conf()")

	hole := listen(t, "127.0.0.1:0")
	http := listenReply(t, "127.0.0.1:0", []byte("HTTP/1.0 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
	addr := pgAddr(pg)
	tests := []struct {
		name, opts string
		addr       netip.AddrPort
		cause      string
		detail     string // in Detail
	}{
		{"ok", pgOptions, addr, CauseOK, ""},
		{"right password", "user=pwuser password=right dbname=postgres", addr, CauseOK, ""},
		{"wrong password", "user=pwuser password=wrong dbname=postgres", addr, CauseAuthFailed, "28P01"},
		{"no such role", "user=nobody dbname=postgres", addr, CauseAuthFailed, "28000"},
		{"role without LOGIN", "user=nologin dbname=postgres", addr, CauseAuthFailed, "28000"},
		{"no database", "user=postgres dbname=nope", addr, CauseNoDatabase, "3D000"},
		{"TLS required, server without TLS", pgOptions + " sslmode=require", addr, CauseTLS, "TLS"},
		{"refused", pgOptions, refusedAddr(t), CauseRefused, "refused"},
		{"not PostgreSQL", pgOptions + " sslmode=disable", http.addr, CauseProtocol, ""},
		{"black hole", pgOptions, hole.addr, CauseTimeout, "timeout"},
		{"missing root certificate", pgOptions + " sslmode=verify-full sslrootcert=/nonexistent/root.crt", addr, CauseConfig, "root.crt"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const timeout = 500 * time.Millisecond
			var r result
			var took time.Duration
			// The password rule applies once the server has reloaded its configuration.
			err := pgtest.WaitFor(5*time.Second, func() error {
				r, took = probe(tt.opts, timeout, tt.addr)
				if r.cause != tt.cause {
					return fmt.Errorf("cause %q (%s), want %q", r.cause, r.detail, tt.cause)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s after %v: %s", r.cause, took.Round(time.Millisecond), r.detail)
			if !strings.Contains(r.detail, tt.detail) || len(r.detail) > maxDetail || (tt.cause != CauseOK) != (r.detail != "") {
				t.Errorf("detail %q: want %q in it, at most %d bytes, empty exactly on success", r.detail, tt.detail, maxDetail)
			}
			if tt.cause == CauseOK && (r.role != RolePrimary || r.wal == 0) {
				t.Errorf("success %+v: want role primary and a WAL position", r)
			}
			if tt.cause == CauseTimeout && (took < timeout || took > timeout+300*time.Millisecond) {
				t.Errorf("timed out after %v, want one timeout (%v)", took, timeout)
			}
		})
	}
	if err := hole.waitOpen(0, time.Second); err != nil {
		t.Errorf("the timed-out probe left its socket open: %v", err)
	}
}

// A server out of connection slots is "too_many_connections" (53300).
func TestPostgresTooManyConnections(t *testing.T) {
	pg := pgtest.New(t, pgtest.Options{Settings: map[string]string{"max_connections": "3", "superuser_reserved_connections": "0"}})
	ctx := context.Background()
	// Take every slot.
	for i := 0; ; i++ {
		conn, err := pgx.Connect(ctx, pg.DSN(""))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "53300" {
			break
		}
		if err != nil || i == 10 {
			t.Fatalf("filling the server's %d connection slots: %v", 3, err)
		}
		t.Cleanup(func() { conn.Close(ctx) })
	}
	r, _ := probe(pgOptions, time.Second, pgAddr(pg))
	if r.cause != CauseTooManyConnections || !strings.Contains(r.detail, "53300") {
		t.Errorf("probe of a full server: %q (%s), want %q", r.cause, r.detail, CauseTooManyConnections)
	}
}

// With ReportWAL, a moving WAL position is published without a transition,
// at most once per Interval; without it, only transitions are published.
func TestReportWAL(t *testing.T) {
	const interval = 100 * time.Millisecond
	pg := pgtest.New(t)
	pg.MustExec(t, "CREATE TABLE w (x int)")
	ctx, cancel := context.WithCancel(context.Background())
	writer := make(chan struct{})
	go func() {
		defer close(writer)
		conn, err := pgx.Connect(ctx, pg.DSN(""))
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		for ctx.Err() == nil {
			conn.Exec(ctx, "INSERT INTO w VALUES (1)")
			time.Sleep(5 * time.Millisecond) // the pace of writes, not a wait for a condition
		}
	}()
	t.Cleanup(func() { cancel(); <-writer })

	c := mustNew(t, Config{Check: CheckPostgres, Options: pgOptions, Interval: interval, Rise: 1, ReportWAL: true})
	c.SetTargets([]Target{{"c/pg", pgAddr(pg)}})
	rec, stop := start(t, c, 0)
	first := rec.waitVerdict("c/pg", 10*time.Second, isState(Up, CauseOK))
	if err := pgtest.WaitFor(10*time.Second, func() error {
		v, n := rec.last()
		if n < 6 || v.At("c/pg").WAL <= first.WAL {
			return fmt.Errorf("%d Views, WAL %X (first %X): want 6 Views and a WAL that moved", n, v.At("c/pg").WAL, first.WAL)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stop()
	rec.mu.Lock()
	for i := 1; i < len(rec.times); i++ {
		if gap := rec.times[i].Sub(rec.times[i-1]); gap < interval-10*time.Millisecond {
			t.Errorf("View %d published %v after the one before: WAL-only Views must be at least Interval (%v) apart", i, gap, interval)
		}
	}
	rec.mu.Unlock()

	// Without ReportWAL: ten probes that each read a new position, one View.
	var probes atomic.Int32
	c = mustNew(t, Config{Check: CheckPostgres, Options: pgOptions, Interval: 20 * time.Millisecond, Rise: 1,
		Observe: func(string, string, time.Duration) { probes.Add(1) }})
	c.SetTargets([]Target{{"c/pg", pgAddr(pg)}})
	rec, _ = start(t, c, 0)
	rec.waitVerdict("c/pg", 10*time.Second, isState(Up, CauseOK))
	if err := pgtest.WaitFor(10*time.Second, func() error {
		if n := probes.Load(); n < 12 {
			return fmt.Errorf("%d probes", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, n := rec.last(); n != 1 {
		t.Errorf("%d Views without ReportWAL and without transitions, want 1", n)
	}
}
