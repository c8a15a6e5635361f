package health

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// sessionConfig is a postgres check whose Interval is long, so that what a
// test sees within a second comes from the session, not from the probes.
func sessionConfig(open *atomic.Int32) Config {
	return Config{Check: CheckPostgres, Options: pgOptions, Interval: 10 * time.Second, Timeout: 500 * time.Millisecond,
		Rise: 1, Fall: 2, RoleInterval: 50 * time.Millisecond,
		ObserveSession: func(d int) { open.Add(int32(d)) }}
}

// A standby's promotion is seen on the open session within a few role
// polls, with its new timeline, long before the next probe; the system
// identifier is the primary's.
func TestSessionSeesPromotion(t *testing.T) {
	primary := pgtest.New(t)
	standby := pgtest.NewStandby(t, primary)
	var open atomic.Int32
	c := mustNew(t, sessionConfig(&open))
	c.SetTargets([]Target{{"c/primary", pgAddr(primary)}, {"c/standby", pgAddr(standby)}})
	rec, _ := start(t, c, 0)
	probeFirst(t, c, "c/primary", "c/standby")
	p := rec.waitVerdict("c/primary", 10*time.Second, isState(Up, CauseOK))
	s := rec.waitVerdict("c/standby", 10*time.Second, isState(Up, CauseOK))
	if p.Role != RolePrimary || p.Timeline != 1 || p.SystemID == 0 {
		t.Fatalf("primary verdict %+v: want role primary, timeline 1, a system identifier", p)
	}
	if s.Role != RoleStandby || s.Timeline != 0 || s.SystemID != p.SystemID {
		t.Fatalf("standby verdict %+v: want role standby, no timeline, the primary's system identifier %d", s, p.SystemID)
	}
	waitSessions(t, &open, 2)

	begun := time.Now()
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	returned := time.Since(begun)
	v := rec.waitVerdict("c/standby", 5*time.Second, func(v Verdict, ok bool) error {
		if v.Role != RolePrimary {
			return fmt.Errorf("role %q, want primary", v.Role)
		}
		return nil
	})
	seen := time.Since(begun)
	if v.Timeline != 2 || v.SystemID != p.SystemID {
		t.Errorf("promoted verdict %+v: want timeline 2 and the system identifier %d", v, p.SystemID)
	}
	// The next probe is 10 s away: only the session can have seen it.
	if seen > 5*time.Second {
		t.Errorf("promotion seen %v after pg_ctl promote began, want well within the 10 s Interval", seen)
	}
	t.Logf("pg_ctl promote -w returned after %v; the checker saw the promotion after %v", returned.Round(time.Millisecond), seen.Round(time.Millisecond))
}

// A server shut down in fast mode ends every session with 57P01: the node is
// probed again at once and leaves at once, without waiting for Fall probes
// of a 10 s Interval.
func TestSessionFastShutdownLeavesAtOnce(t *testing.T) {
	pg := pgtest.New(t)
	var open atomic.Int32
	rec := startOneSession(t, sessionConfig(&open), pgAddr(pg), &open)

	begun := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- pg.StopMode("fast") }()
	v := rec.waitVerdict("c/pg", 5*time.Second, func(v Verdict, ok bool) error {
		if v.State != Down {
			return fmt.Errorf("%v/%s, want down", v.State, v.Cause)
		}
		return nil
	})
	took := time.Since(begun)
	if !going(v.Cause) {
		t.Errorf("down with cause %s (%s), want refused, shutting_down or starting_up", v.Cause, v.Detail)
	}
	if took > 5*time.Second {
		t.Errorf("down %v after the stop began, want well within Fall x Interval (20 s)", took)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	waitSessions(t, &open, 0)
	t.Logf("down (%s) %v after pg_ctl stop -m fast began", v.Cause, took.Round(time.Millisecond))
}

// Someone ends the monitoring session (pg_terminate_backend): the target is
// Leaving until the probe that follows connects, is never down, and a new
// session opens.
func TestSessionTerminatedChangesNothing(t *testing.T) {
	pg := pgtest.New(t)
	var open atomic.Int32
	cfg := sessionConfig(&open)
	cfg.Options += " application_name=pgcluster_session_test"
	rec := startOneSession(t, cfg, pgAddr(pg), &open)
	_, before := rec.last()
	pid := func() (n int) {
		query(t, pg, func(conn *pgx.Conn) error {
			return conn.QueryRow(context.Background(),
				"SELECT coalesce(max(pid), 0) FROM pg_stat_activity WHERE application_name = 'pgcluster_session_test'").Scan(&n)
		})
		return n
	}
	first := pid()
	if first == 0 {
		t.Fatal("no session of the checker in pg_stat_activity")
	}
	query(t, pg, func(conn *pgx.Conn) error {
		_, err := conn.Exec(context.Background(), "SELECT pg_terminate_backend($1)", first)
		return err
	})
	err := pgtest.WaitFor(10*time.Second, func() error {
		if n := pid(); n == 0 || n == first {
			return fmt.Errorf("session pid %d, want a new one after %d was terminated", n, first)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Leaving while the probe that follows runs, then as before: never down.
	rec.waitVerdict("c/pg", 10*time.Second, func(v Verdict, ok bool) error {
		if v.State != Up || v.Leaving {
			return fmt.Errorf("%v, leaving %t: want up, no longer leaving", v.State, v.Leaving)
		}
		return nil
	})
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i, v := range rec.views[before:] {
		if v.At("c/pg").State != Up {
			t.Errorf("View %d after the session was terminated: %v/%s, want up throughout", before+i, v.At("c/pg").State, v.At("c/pg").Cause)
		}
	}
}

// A smart shutdown waits for every session to end and refuses new ones with
// 57P03: the probe that gets 57P03 closes the session, so the shutdown
// completes.
func TestSessionLetsSmartShutdownFinish(t *testing.T) {
	pg := pgtest.New(t)
	var open atomic.Int32
	cfg := sessionConfig(&open)
	cfg.Interval = 200 * time.Millisecond
	rec := startOneSession(t, cfg, pgAddr(pg), &open)
	begun := time.Now()
	if err := pg.StopMode("smart"); err != nil {
		t.Fatal(err)
	}
	rec.waitVerdict("c/pg", 10*time.Second, func(v Verdict, ok bool) error {
		if v.State != Down {
			return fmt.Errorf("%v/%s, want down", v.State, v.Cause)
		}
		return nil
	})
	waitSessions(t, &open, 0)
	t.Logf("smart shutdown finished %v after it began", time.Since(begun).Round(time.Millisecond))
}

// A host that stops answering sends no reset: a poll that misses Timeout
// counts as a failed probe and the node is probed again at once, so it
// leaves within about two Timeouts, not Fall Intervals.
func TestSessionPollTimeoutCounts(t *testing.T) {
	pg := pgtest.New(t)
	fz := newFreezer(t, pgAddr(pg))
	var open atomic.Int32
	cfg := sessionConfig(&open)
	rec := startOneSession(t, cfg, fz.addr, &open)
	begun := time.Now()
	fz.freeze()
	v := rec.waitVerdict("c/pg", 10*time.Second, isState(Down, CauseTimeout))
	took := time.Since(begun)
	if took > 5*time.Second {
		t.Errorf("down %v after the host froze, want about two Timeouts (%v each), well within Fall x Interval (20 s)", took, cfg.Timeout)
	}
	t.Logf("down (%s: %s) %v after the host froze", v.Cause, v.Detail, took.Round(time.Millisecond))
	waitSessions(t, &open, 0)
}

// The probe owed at once after a session poll that went unanswered may
// itself be seen late (the process starved of CPU, see LateAfter): it is
// not judged, and another follows at once, not an Interval (10 s) on, so
// that the frozen host still leaves within a few Timeouts. Here the first
// probe after the freeze stands for a starved process: it returns its
// timeout a Timeout late, and so does the next: as many as the late rule
// leaves unjudged in a row (Fall).
//
// With Fall 3 the probes judged after the late ones must be made at once
// too, each of them owed until the host answers or is Down.
func TestSessionPollTimeoutLateProbe(t *testing.T) {
	for _, fall := range []int{2, 3} {
		t.Run(fmt.Sprintf("fall %d", fall), func(t *testing.T) { sessionPollTimeoutLateProbe(t, fall) })
	}
}

func sessionPollTimeoutLateProbe(t *testing.T, fall int) {
	pg := pgtest.New(t)
	fz := newFreezer(t, pgAddr(pg))
	var open atomic.Int32
	var late atomic.Int32 // probes still to be seen late
	var lates atomic.Int32
	cfg := sessionConfig(&open)
	cfg.Fall = fall
	cfg.Observe = func(_, cause string, _ time.Duration) {
		if cause == CauseLate {
			lates.Add(1)
		}
	}
	late.Store(-1 << 20)
	rec := startOneSessionWith(t, cfg, fz.addr, &open, func(c *Checker) {
		inner := c.probe
		c.probe = func(ctx context.Context, addr netip.AddrPort) result {
			if late.Add(-1) >= 0 {
				<-ctx.Done()
				time.Sleep(cfg.Timeout) // the process ran again only now
				return failure(CauseTimeout, ctx.Err())
			}
			return inner(ctx, addr)
		}
	})
	begun := time.Now()
	late.Store(int32(cfg.Fall))
	fz.freeze()
	v := rec.waitVerdict("c/pg", 9*time.Second, isState(Down, CauseTimeout))
	took := time.Since(begun)
	t.Logf("down (%s: %s) %v after the host froze; %d probes seen late", v.Cause, v.Detail, took.Round(time.Millisecond), lates.Load())
	if lates.Load() == 0 {
		t.Errorf("no probe was seen late: the test did not starve the probe owed after the poll")
	}
	waitSessions(t, &open, 0)
}

// Sessions are kept only where they may be: not with NoSessions, not for a
// Shared that does not implement Sessions, and with one that does, only
// for the targets it allows.
func TestSessionOnlyWhereAllowed(t *testing.T) {
	pg := pgtest.New(t)
	for _, tt := range []struct {
		name   string
		noSess bool
		shared Shared
		want   int32
	}{
		{"NoSessions", true, nil, 0},
		{"Shared without Sessions", false, allShared{}, 0},
		{"Sessions allows one", false, sessionShared{keep: "c/a"}, 1},
		{"no Shared", false, nil, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var open, probes, most atomic.Int32
			cfg := sessionConfig(&open)
			// The most sessions ever open at once: a session that a
			// starved poll closed may be open again a moment later, but
			// more than allowed must never be open.
			cfg.ObserveSession = func(d int) {
				n := open.Add(int32(d))
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
			}
			cfg.Interval = 100 * time.Millisecond
			cfg.Observe = func(string, string, time.Duration) { probes.Add(1) }
			cfg.Shared = tt.shared
			if tt.noSess {
				cfg.RoleInterval = NoSessions
			}
			c := mustNew(t, cfg)
			c.SetTargets([]Target{{"c/a", pgAddr(pg)}, {"c/b", pgAddr(pg)}})
			rec, stop := start(t, c, 0)
			rec.waitVerdict("c/a", 10*time.Second, isState(Up, CauseOK))
			rec.waitVerdict("c/b", 10*time.Second, isState(Up, CauseOK))
			waitSessions(t, &open, tt.want)
			// Several more probes of each: the count stays.
			n := probes.Load()
			err := pgtest.WaitFor(5*time.Second, func() error {
				if probes.Load() < n+6 {
					return errors.New("waiting for more probes")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := most.Load(); got > tt.want {
				t.Errorf("%d sessions were open at once, want at most %d", got, tt.want)
			}
			// Those allowed are kept (or opened again after a poll that
			// missed its deadline on a loaded machine).
			waitSessions(t, &open, tt.want)
			stop()
			waitSessions(t, &open, 0)
		})
	}
}

// A session ends within a poll of Shared no longer allowing it (the lease
// went to another instance), not at the next probe of a 10 s Interval.
func TestSessionEndsWithItsLease(t *testing.T) {
	pg := pgtest.New(t)
	var open atomic.Int32
	cfg := sessionConfig(&open)
	keep := &toggleShared{}
	keep.allow.Store(true)
	cfg.Shared = keep
	startOneSession(t, cfg, pgAddr(pg), &open)
	begun := time.Now()
	keep.allow.Store(false)
	waitSessions(t, &open, 0)
	if took := time.Since(begun); took > 5*time.Second {
		t.Errorf("the session closed %v after its lease went, want within a few polls (RoleInterval %v), not at the next probe", took, cfg.RoleInterval)
	}
}

// toggleShared probes every target and allows sessions while allow holds.
type toggleShared struct{ allow atomic.Bool }

func (*toggleShared) Claim(Target) (bool, Progress) { return true, Progress{} }
func (*toggleShared) Record(Target, Progress)       {}
func (s *toggleShared) KeepSession(Target) bool     { return s.allow.Load() }

// allShared probes every target and allows no session (it does not
// implement Sessions).
type allShared struct{}

func (allShared) Claim(Target) (bool, Progress) { return true, Progress{} }
func (allShared) Record(Target, Progress)       {}

// sessionShared probes every target and allows a session to keep only.
type sessionShared struct{ keep string }

func (sessionShared) Claim(Target) (bool, Progress) { return true, Progress{} }
func (sessionShared) Record(Target, Progress)       {}
func (s sessionShared) KeepSession(t Target) bool   { return t.Key == s.keep }

// startOneSession runs a checker of cfg with one target, c/pg at addr,
// until the test ends, and waits until it is Up with its session open
// (counted in open, cfg's ObserveSession).
func startOneSession(t *testing.T, cfg Config, addr netip.AddrPort, open *atomic.Int32) *recorder {
	t.Helper()
	return startOneSessionWith(t, cfg, addr, open, nil)
}

// startOneSessionWith is startOneSession, calling setup, when given, with
// the checker before it runs.
func startOneSessionWith(t *testing.T, cfg Config, addr netip.AddrPort, open *atomic.Int32, setup func(*Checker)) *recorder {
	t.Helper()
	c := mustNew(t, cfg)
	if setup != nil {
		setup(c)
	}
	c.SetTargets([]Target{{"c/pg", addr}})
	rec, _ := start(t, c, 0)
	probeFirst(t, c, "c/pg")
	rec.waitVerdict("c/pg", 10*time.Second, isState(Up, CauseOK))
	waitSessions(t, open, 1)
	return rec
}

// probeFirst asks for the first probe of keys at once, as soon as c runs.
// A target's first tick falls at a random point of its first Interval (10 s
// in sessionConfig), which a 10 s wait for Up would race: it lost under
// load, when the tick came late in the Interval and the probe took long.
func probeFirst(t testing.TB, c *Checker, keys ...string) {
	t.Helper()
	err := pgtest.WaitFor(5*time.Second, func() error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.run == nil {
			return errors.New("Run has not started")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		c.ProbeNow(k)
	}
}

// waitSessions waits until n sessions are open.
func waitSessions(t testing.TB, open *atomic.Int32, n int32) {
	t.Helper()
	err := pgtest.WaitFor(10*time.Second, func() error {
		if got := open.Load(); got != n {
			return fmt.Errorf("%d sessions open, want %d", got, n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// freezer forwards TCP connections to a server until freeze, after which
// it forwards nothing more either way and closes nothing: a host that
// stopped answering.
type freezer struct {
	addr   netip.AddrPort
	gate   sync.RWMutex // write-held once frozen
	mu     sync.Mutex
	frozen bool
}

func newFreezer(t testing.TB, to netip.AddrPort) *freezer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{addr: ln.Addr().(*net.TCPAddr).AddrPort()}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Go(func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", to.String())
			if err != nil {
				in.Close()
				continue
			}
			track(in)
			track(out)
			wg.Go(func() { f.copy(out, in) })
			wg.Go(func() { f.copy(in, out) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		f.mu.Lock()
		if f.frozen {
			f.gate.Unlock()
			f.frozen = false
		}
		f.mu.Unlock()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return f
}

func (f *freezer) freeze() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.frozen {
		f.gate.Lock()
		f.frozen = true
	}
}

// copy forwards src to dst, each write waiting while frozen.
func (f *freezer) copy(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f.gate.RLock()
			_, werr := dst.Write(buf[:n])
			f.gate.RUnlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				dst.Close()
			}
			return
		}
	}
}
