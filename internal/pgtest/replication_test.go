package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestHost: a server listens on the loopback address it is given, and only
// there; DSN names it; the demo's listen_addresses setting still picks it;
// anything but a loopback address is refused before anything starts.
func TestHost(t *testing.T) {
	p := New(t, Options{Host: "127.0.0.2"})
	if p.Host != "127.0.0.2" || !strings.Contains(p.DSN(""), "@127.0.0.2:"+strconv.Itoa(p.Port)+"/") {
		t.Fatalf("Host %q, DSN %q: want both on 127.0.0.2:%d", p.Host, p.DSN(""), p.Port)
	}
	p.MustExec(t, "SELECT 1")
	// It listens on its address alone. (A dial of 127.0.0.1 on its port
	// says nothing: another test's server may have that port there.)
	var listen string
	if err := p.QueryRow(context.Background(), "SHOW listen_addresses", &listen); err != nil || listen != "127.0.0.2" {
		t.Fatalf("server on 127.0.0.2 listens on %q (%v), want 127.0.0.2 alone", listen, err)
	}

	d := New(t, Options{Settings: map[string]string{"listen_addresses": "127.0.0.4"}})
	if d.Host != "127.0.0.4" {
		t.Fatalf("listen_addresses 127.0.0.4: Host is %q", d.Host)
	}
	d.MustExec(t, "SELECT 1")

	if q := New(t); q.Host != DefaultHost {
		t.Fatalf("default Host is %q, want %s", q.Host, DefaultHost)
	}

	for _, h := range []string{"192.0.2.1", "localhost", "0.0.0.0"} {
		if _, err := Start(Options{Host: h}); err == nil || !strings.Contains(err.Error(), "not a loopback IP address") {
			t.Errorf("Host %q: err = %v, want a refusal naming loopback", h, err)
		}
	}
}

// TestReplication: a primary on 127.0.0.2 and a standby made by pg_basebackup
// -R on 127.0.0.3 stream; paused replay leaves the standby's replayed
// position behind the primary's; resumed, it catches up; promoted while the
// old primary still runs, both are primaries. Each step is timed and logged.
func TestReplication(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const wait = 10 * time.Second
	begin := time.Now()
	step := func(name string, start time.Time) {
		t.Logf("%-40s %v", name, time.Since(start).Round(time.Millisecond))
	}

	start := time.Now()
	primary := New(t, Options{Host: "127.0.0.2"})
	step("start primary on 127.0.0.2", start)

	start = time.Now()
	standby := NewStandby(t, primary, Options{Host: "127.0.0.3"})
	step("pg_basebackup -R, start, streaming", start)
	if standby.Host != "127.0.0.3" || standby.Port == primary.Port && standby.Host == primary.Host {
		t.Fatalf("standby at %s:%d, primary at %s:%d", standby.Host, standby.Port, primary.Host, primary.Port)
	}
	mustRecovery(ctx, t, primary, false)
	mustRecovery(ctx, t, standby, true)

	// A write on the primary shows on the standby.
	start = time.Now()
	primary.MustExec(t, "CREATE TABLE t(x int); INSERT INTO t VALUES (1)")
	if err := WaitFor(wait, func() error { return hasRow(ctx, standby, 1) }); err != nil {
		t.Fatal(err)
	}
	step("write on primary, seen on standby", start)

	// Paused replay: the standby receives the write but does not replay it.
	start = time.Now()
	if err := standby.PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	step("pause replay", start)
	start = time.Now()
	primary.MustExec(t, "INSERT INTO t VALUES (2)")
	written, err := primary.CurrentLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := WaitFor(wait, func() error {
		var received int64
		if err := standby.queryRow(ctx, "SELECT pg_wal_lsn_diff(pg_last_wal_receive_lsn(), '0/0')::bigint", &received); err != nil {
			return err
		}
		if uint64(received) < written {
			return fmt.Errorf("standby received up to %d, primary wrote up to %d", received, written)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	replayed, err := standby.ReplayLSN(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if replayed >= written {
		t.Fatalf("replay paused, yet the standby replayed up to %d, the primary's current position being %d", replayed, written)
	}
	if err := hasRow(ctx, standby, 2); err == nil {
		t.Fatal("replay paused, yet the row written since shows on the standby")
	}
	t.Logf("paused: primary at %d, standby received it and replayed up to %d: %d bytes behind", written, replayed, written-replayed)
	step("write while paused, received not replayed", start)

	// Resumed, the standby catches up.
	start = time.Now()
	if err := standby.ResumeReplay(ctx); err != nil {
		t.Fatal(err)
	}
	if err := WaitFor(wait, func() error {
		replayed, err := standby.ReplayLSN(ctx)
		if err != nil {
			return err
		}
		if replayed < written {
			return fmt.Errorf("standby replayed up to %d, primary at %d", replayed, written)
		}
		return hasRow(ctx, standby, 2)
	}); err != nil {
		t.Fatal(err)
	}
	step("resume replay, caught up", start)

	// Promoted while the old primary still runs: two primaries.
	start = time.Now()
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	step("promote standby", start)
	mustRecovery(ctx, t, standby, false)
	mustRecovery(ctx, t, primary, false)
	standby.MustExec(t, "INSERT INTO t VALUES (3)")
	primary.MustExec(t, "INSERT INTO t VALUES (4)")
	if _, err := standby.CurrentLSN(ctx); err != nil {
		t.Fatalf("promoted standby has no current WAL position: %v", err)
	}

	// Closed, both are gone: servers stopped, directories removed.
	start = time.Now()
	for _, p := range []*Postgres{standby, primary} {
		p.Close()
		if _, err := os.Stat(p.Dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after Close, %s still exists (%v)", p.Dir, err)
		}
		if err := p.Exec(ctx, "SELECT 1"); err == nil {
			t.Errorf("after Close, %s still answers", p.DSN(""))
		}
	}
	step("close both", start)
	step("total", begin)
}

// TestStartStandbyErrors: a standby of a server that is not running fails
// with pg_basebackup's reason and leaves no directory behind.
func TestStartStandbyErrors(t *testing.T) {
	if _, err := StartStandby(nil, Options{}); err == nil {
		t.Fatal("StartStandby(nil) succeeded")
	}
	primary := New(t, Options{Host: "127.0.0.2"})
	if err := primary.Stop(); err != nil {
		t.Fatal(err)
	}
	parent := t.TempDir()
	if err := os.Chmod(parent, 0o755); err != nil { // the postgres user must reach it
		t.Fatal(err)
	}
	if _, err := StartStandby(primary, Options{Host: "127.0.0.3", Dir: parent}); err == nil || !strings.Contains(err.Error(), "pg_basebackup") {
		t.Fatalf("standby of a stopped primary: err = %v, want pg_basebackup's failure", err)
	}
	if left, _ := os.ReadDir(parent); len(left) != 0 {
		t.Fatalf("failed StartStandby left %v in %s", left, parent)
	}
	if _, err := StartStandby(primary, Options{Host: "192.0.2.1"}); err == nil || !strings.Contains(err.Error(), "not a loopback IP address") {
		t.Fatalf("standby on 192.0.2.1: err = %v, want a refusal naming loopback", err)
	}
}

func mustRecovery(ctx context.Context, t *testing.T, p *Postgres, want bool) {
	t.Helper()
	got, err := p.InRecovery(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("%s: pg_is_in_recovery() = %v, want %v", p.DSN(""), got, want)
	}
}

// hasRow returns nil when table t of p holds x.
func hasRow(ctx context.Context, p *Postgres, x int) error {
	var n int
	if err := p.queryRow(ctx, "SELECT count(*) FROM t WHERE x = "+strconv.Itoa(x), &n); err != nil {
		return err
	}
	if n != 1 {
		return fmt.Errorf("%s: row %d not there", p.DSN(""), x)
	}
	return nil
}
