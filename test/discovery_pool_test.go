package test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcluster/pgcluster/discovery"
	"github.com/pgcluster/pgcluster/internal/proc"
)

// The phases of TestDiscoveryPool. A query counts in the phase in which it
// started.
const (
	phSteady  = iota // nothing happens
	phRemoval        // a standby leaves the registry, then is stopped
	phSwitch         // the primary switches, the old one turns read-only
	phSettled        // after the switch
	phDNS            // CoreDNS is stopped, the pools reconnect, CoreDNS restarts
	nPhases
)

var phaseNames = [nPhases]string{"steady", "node removal", "primary switch", "after the switch", "DNS restart"}

// TestDiscoveryPool runs a write pool on primary.prod and a read pool on
// standby.prod — discovery.Pools, through the real plugin, on real
// PostgreSQL nodes — under a steady query load, through a node's removal, a
// primary switch and a restart of the DNS server, and counts the failed
// queries of each phase (go test -v -run TestDiscoveryPool ./test/ for the
// figures).
//
// Zero failures is achievable, and asserted, everywhere except for the
// writes of the primary switch:
//
//   - removal: the removed node still runs while its connections drain
//     (idle ones are closed when the Watcher sees it leave, busy ones when
//     released, and none is handed out again), so no query is lost; the
//     node is stopped only once it has no connection left from the pool;
//   - primary switch, reads: the old standby keeps serving reads while the
//     read pool moves to the new one;
//   - DNS restart: nothing about the nodes changes; the Watchers keep their
//     last answer, and new connections (the pools are reset while DNS is
//     down) are made from it without asking DNS;
//   - primary switch, writes: a write that reaches the old primary after it
//     turned read-only and before the Watcher learnt of the switch fails
//     with SQLSTATE 25006. No client can avoid that — its connection was
//     fine a moment before — but each such failure closes its connection
//     and makes the Watcher resolve at once, and new connections wait for
//     that resolution instead of going back to the old primary, so each
//     connection the pool held to the old primary fails at most once: a
//     few failures (4 here, measured), never a stream. (Without that wait,
//     new connections would go back to the old primary and fail until the
//     Watcher resolved, which MinInterval may hold back for 500 ms.)
func TestDiscoveryPool(t *testing.T) {
	reg := Registry(t)
	nodes := startNodes(t, 3)
	for _, n := range nodes {
		n.pg.MustExec(t, "CREATE TABLE w(id bigserial PRIMARY KEY, port int NOT NULL)")
	}
	register(t, reg, nodes...)
	dnsPort, err := proc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	corefile := stableCorefile(reg.DSN(""), dnsPort)
	dns := StartCoreDNS(t, corefile)
	ctx := Ctx(t)
	start := time.Now()

	cl, err := discovery.New(discovery.Config{Servers: []string{dns.UDP}, DNSTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var events eventLog
	newPool := func(app, name string) (*discovery.Pool, *atomic.Int64) {
		t.Helper()
		dnsErrors := new(atomic.Int64)
		url := fmt.Sprintf("postgres://postgres@%s.pgcluster.lan/postgres?sslmode=disable&connect_timeout=5&pool_max_conns=4&application_name=%s", name, app)
		p, err := cl.NewPool(ctx, url, discovery.WatchOptions{
			OnEvent: func(e discovery.Event) { events.add(start, app, e) },
			OnError: func(error) { dnsErrors.Add(1) },
		})
		if err != nil {
			t.Fatalf("pool on %s: %v", name, err)
		}
		t.Cleanup(p.Close)
		return p, dnsErrors
	}
	writer, writerDNSErrors := newPool("writer", "primary.prod")
	reader, readerDNSErrors := newPool("reader", "standby.prod")

	// The load: three workers per pool, each running a query every 5 ms.
	// A write reports the port of the server that took it, as a read does.
	load := newLoad()
	writes := load.run("writer", func(ctx context.Context) (port int, err error) {
		err = writer.QueryRow(ctx, "INSERT INTO w(port) SELECT inet_server_port() RETURNING port").Scan(&port)
		return port, err
	})
	reads := load.run("reader", func(ctx context.Context) (port int, err error) {
		// The short sleep keeps connections busy when things change.
		err = reader.QueryRow(ctx, "SELECT inet_server_port() FROM pg_sleep(0.002)").Scan(&port)
		return port, err
	})
	t.Cleanup(load.stop) // before the pools close (cleanups run last first)
	byPort := map[int]string{}
	for _, n := range nodes {
		byPort[n.pg.Port] = n.name
	}
	defer func() {
		load.stop()
		for _, tl := range []*tally{writes, reads} {
			for ph := range nPhases {
				t.Logf("%s, %s: %s", tl.name, phaseNames[ph], tl.summary(ph, byPort))
			}
		}
		t.Logf("events:\n%s", events.String())
	}()

	// Steady: the writes go to n1, the reads to a standby: call it "gone",
	// the one that will be removed, and the other "next", the next primary.
	awaitQueries(t, 30, phSteady, writes, reads)
	var gone, next dbNode
	switch reads.top(phSteady) {
	case nodes[1].pg.Port:
		gone, next = nodes[1], nodes[2]
	case nodes[2].pg.Port:
		gone, next = nodes[2], nodes[1]
	default:
		t.Fatalf("reads went to %v, not to a standby", reads.ports(phSteady))
	}
	primary := nodes[0]

	// Removal of the standby the reads use.
	load.enter(phRemoval)
	reg.MustExec(t, "DELETE FROM pgcluster_nodes WHERE name = '"+gone.name+"'")
	committed := time.Now()
	Eventually(t, 10*time.Second, func() error {
		if reader.Watcher().Contains(addrPort(gone)) {
			return fmt.Errorf("the read pool's Watcher still has %s", gone.name)
		}
		return nil
	})
	t.Logf("removal: the read pool's Watcher dropped %s %v after COMMIT (TTL 1s)", gone.name, time.Since(committed))
	awaitNoConns(t, gone, "reader")
	t.Logf("removal: %s had no connection from the read pool %v after COMMIT", gone.name, time.Since(committed))
	// Decommission it: a connection left behind would now fail its query.
	if err := gone.pg.Stop(); err != nil {
		t.Fatal(err)
	}
	awaitQueries(t, 30, phRemoval, writes, reads)

	// Primary switch: the registry names the new primary, and the old one
	// turns read-only at once, as after a failover (the other order would
	// add the writes made while the registry lags behind, which no client
	// can avoid). default_transaction_read_only reaches the sessions
	// already open at their next statement.
	load.enter(phSwitch)
	// The worst moment: just after the write pool's Watcher resolved, so
	// that its next resolution is a TTL away and one asked for by an error
	// is held back by MinInterval (500 ms).
	if err := writer.Watcher().Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	reg.MustExec(t, fmt.Sprintf("UPDATE pgcluster_nodes SET role = CASE name WHEN '%s' THEN 'primary' ELSE 'standby' END", next.name))
	committed = time.Now()
	primary.pg.MustExec(t, "ALTER SYSTEM SET default_transaction_read_only = on")
	primary.pg.MustExec(t, "SELECT pg_reload_conf()")
	Eventually(t, 10*time.Second, func() error {
		if w := writer.Watcher(); w.Contains(addrPort(primary)) || !w.Contains(addrPort(next)) {
			return fmt.Errorf("the write pool's Watcher has %v", w.Candidates())
		}
		if w := reader.Watcher(); w.Contains(addrPort(next)) || !w.Contains(addrPort(primary)) {
			return fmt.Errorf("the read pool's Watcher has %v", w.Candidates())
		}
		return nil
	})
	t.Logf("switch: both Watchers had the new roles %v after COMMIT", time.Since(committed))
	awaitNoConns(t, primary, "writer")
	awaitNoConns(t, next, "reader")
	t.Logf("switch: the old primary had no write connection, the new one no read connection, %v after COMMIT", time.Since(committed))
	if ro := queryString(t, primary, "SHOW default_transaction_read_only"); ro != "on" {
		t.Fatalf("the old primary is not read-only (%s): the switch tested nothing", ro)
	}

	load.enter(phSettled)
	awaitQueries(t, 30, phSettled, writes, reads)

	// DNS restart: stop CoreDNS, make both pools open new connections
	// while it is down, start it again on the same port.
	load.enter(phDNS)
	dns.Stop()
	stopped := time.Now()
	wErrs, rErrs := writerDNSErrors.Load(), readerDNSErrors.Load()
	wConns, rConns := writer.Stat().NewConnsCount(), reader.Stat().NewConnsCount()
	writer.Reset()
	reader.Reset()
	Eventually(t, 10*time.Second, func() error {
		switch {
		case writerDNSErrors.Load() == wErrs || readerDNSErrors.Load() == rErrs:
			return fmt.Errorf("the Watchers have not tried DNS since it stopped")
		case writer.Stat().NewConnsCount() == wConns || reader.Stat().NewConnsCount() == rConns:
			return fmt.Errorf("the pools have not reconnected since the reset")
		}
		return nil
	})
	t.Logf("DNS restart: both Watchers failed to resolve and both pools reconnected %v after CoreDNS stopped", time.Since(stopped))
	if again := StartCoreDNS(t, corefile); again.UDP != dns.UDP {
		t.Fatalf("CoreDNS restarted on %s, not %s", again.UDP, dns.UDP)
	}
	restarted := time.Now()
	for _, p := range []*discovery.Pool{writer, reader} {
		Eventually(t, 10*time.Second, func() error {
			ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			return p.Watcher().Refresh(ctx)
		})
	}
	t.Logf("DNS restart: both Watchers resolved again %v after CoreDNS restarted", time.Since(restarted))
	awaitQueries(t, 30, phDNS, writes, reads)
	if got := writer.Watcher().Candidates(); len(got) != 1 || got[0].Addr != addrPort(next) {
		t.Errorf("the write pool's Watcher has %v after the DNS restart, want %s", got, next.addr())
	}
	if got := reader.Watcher().Candidates(); len(got) != 1 || got[0].Addr != addrPort(primary) {
		t.Errorf("the read pool's Watcher has %v after the DNS restart, want %s", got, primary.addr())
	}
	load.stop()

	// The bound on failed writes in the switch: each connection the pool
	// held to the old primary (pool_max_conns=4) fails once, and new ones
	// wait for the Watcher to resolve. Should the plugin lag behind the
	// registry for longer than that resolution took, another batch may
	// fail, once per MinInterval; three batches leave room for a slow
	// machine.
	const switchBound = 3 * 4
	for ph := range nPhases {
		want := 0
		if ph == phSwitch {
			want = switchBound
		}
		if n := writes.failures(ph); n > want {
			t.Errorf("writes, %s: %d failed, want at most %d", phaseNames[ph], n, want)
		}
		if n := reads.failures(ph); n > 0 {
			t.Errorf("reads, %s: %d failed, want none", phaseNames[ph], n)
		}
	}
	for _, e := range writes.errors(phSwitch) {
		if !strings.Contains(e, "25006") {
			t.Errorf("a write failed in the switch other than with SQLSTATE 25006: %s", e)
		}
	}
	// After the switch, every write reached the new primary and every read
	// the new standby.
	if got := writes.ports(phSettled); len(got) != 1 || got[next.pg.Port] == 0 {
		t.Errorf("writes after the switch reached %v, want only %s (port %d)", got, next.name, next.pg.Port)
	}
	if got := reads.ports(phSettled); len(got) != 1 || got[primary.pg.Port] == 0 {
		t.Errorf("reads after the switch reached %v, want only %s (port %d)", got, primary.name, primary.pg.Port)
	}
}

// addrPort is the node's address as a Watcher holds it.
func addrPort(n dbNode) netip.AddrPort { return netip.MustParseAddrPort(n.addr()) }

// awaitNoConns waits until node has no session from application app.
func awaitNoConns(t *testing.T, n dbNode, app string) {
	t.Helper()
	Eventually(t, 10*time.Second, func() error {
		c := queryString(t, n, "SELECT count(*) FROM pg_stat_activity WHERE application_name = '"+app+"'")
		if c != "0" {
			return fmt.Errorf("%s still has %s connections from the %s pool", n.name, c, app)
		}
		return nil
	})
}

// queryString runs a query returning one value on node n, as text.
func queryString(t *testing.T, n dbNode, sql string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, n.pg.DSN(""))
	if err != nil {
		t.Fatalf("%s: %v", n.name, err)
	}
	defer conn.Close(ctx)
	var s string
	if err := conn.QueryRow(ctx, sql, pgx.QueryExecModeSimpleProtocol).Scan(&s); err != nil {
		t.Fatalf("%s: %s: %v", n.name, sql, err)
	}
	return s
}

// awaitQueries waits until each tally has n successful queries in phase.
func awaitQueries(t *testing.T, n, phase int, tallies ...*tally) {
	t.Helper()
	Eventually(t, 20*time.Second, func() error {
		for _, tl := range tallies {
			if got := tl.successes(phase); got < n {
				return fmt.Errorf("%s: %d queries in phase %s, want %d", tl.name, got, phaseNames[phase], n)
			}
		}
		return nil
	})
}

// load runs queries in a loop from several workers per pool, and counts
// them by phase.
type load struct {
	phase   atomic.Int32
	done    chan struct{}
	stopped sync.Once
	wg      sync.WaitGroup
}

func newLoad() *load { return &load{done: make(chan struct{})} }

func (l *load) enter(phase int) { l.phase.Store(int32(phase)) }

// stop stops the workers and waits for them; a second call does nothing.
func (l *load) stop() {
	l.stopped.Do(func() { close(l.done) })
	l.wg.Wait()
}

// run starts three workers running query every 5 ms (or as fast as it
// returns, when slower).
func (l *load) run(name string, query func(context.Context) (int, error)) *tally {
	tl := &tally{name: name}
	for range 3 {
		l.wg.Go(func() {
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-l.done:
					return
				case <-tick.C:
				}
				phase := int(l.phase.Load())
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				port, err := query(ctx)
				cancel()
				tl.record(phase, port, err)
			}
		})
	}
	return tl
}

// tally counts one pool's queries by phase.
type tally struct {
	name string

	mu     sync.Mutex
	ok     [nPhases]map[int]int // successful queries by server port
	failed [nPhases][]string    // the errors
}

func (tl *tally) record(phase, port int, err error) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if err != nil {
		msg := err.Error()
		if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
			msg = "SQLSTATE " + pe.Code + ": " + msg
		}
		tl.failed[phase] = append(tl.failed[phase], msg)
		return
	}
	if tl.ok[phase] == nil {
		tl.ok[phase] = map[int]int{}
	}
	tl.ok[phase][port]++
}

func (tl *tally) successes(phase int) int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	n := 0
	for _, c := range tl.ok[phase] {
		n += c
	}
	return n
}

func (tl *tally) failures(phase int) int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return len(tl.failed[phase])
}

func (tl *tally) errors(phase int) []string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return slices.Clone(tl.failed[phase])
}

func (tl *tally) ports(phase int) map[int]int {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return maps.Clone(tl.ok[phase])
}

// top returns the port that served the most queries in phase.
func (tl *tally) top(phase int) int {
	best, n := 0, 0
	for p, c := range tl.ports(phase) {
		if c > n {
			best, n = p, c
		}
	}
	return best
}

// summary is "N ok (n1 N, ...), N failed" and the first distinct errors.
func (tl *tally) summary(phase int, byPort map[int]string) string {
	ports, errs := tl.ports(phase), tl.errors(phase)
	var parts []string
	total := 0
	for _, p := range slices.Sorted(maps.Keys(ports)) {
		total += ports[p]
		parts = append(parts, fmt.Sprintf("%s %d", byPort[p], ports[p]))
	}
	s := fmt.Sprintf("%d ok (%s), %d failed", total, strings.Join(parts, ", "), len(errs))
	seen := map[string]bool{}
	for _, e := range errs {
		if !seen[e] && len(seen) < 3 {
			seen[e] = true
			s += "\n\t" + e
		}
	}
	return s
}

// eventLog records the Watchers' events with their time since start.
type eventLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *eventLog) add(start time.Time, pool string, e discovery.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	which := "name"
	if e.Primary {
		which = "primary"
	}
	l.lines = append(l.lines, fmt.Sprintf("\t+%-8v %s %s %s (%s, %s)", time.Since(start).Round(time.Millisecond), pool, e.Kind, e.Candidate.Addr, which, e.Reason))
}

func (l *eventLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
