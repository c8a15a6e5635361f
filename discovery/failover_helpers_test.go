package discovery

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// realServer starts a PostgreSQL server on host (a loopback address) with
// the table the writer fills.
func realServer(t *testing.T, host string) *pgtest.Postgres {
	t.Helper()
	p := pgtest.New(t, pgtest.Options{Host: host})
	p.MustExec(t, "CREATE TABLE w (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())")
	return p
}

// nodeOf is the zone's node for p.
func nodeOf(name string, p *pgtest.Postgres, role string) discoverytest.Node {
	return discoverytest.Node{Name: name, Addr: netip.MustParseAddrPort(p.HostPort()), Role: role}
}

// commit is one write the pool committed.
type commit struct {
	acquired, done time.Time
	addr           netip.AddrPort
}

// writer writes through a pool every period, as an application does, and
// records where each write committed.
type writer struct {
	mu       sync.Mutex
	commits  []commit
	attempts int
	lastErr  error
	cancel   context.CancelFunc
	done     chan struct{}
}

// acquirer is a pool the writer writes through: a Pool, or a plain
// pgxpool.Pool to compare with.
type acquirer interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// startWriter starts n goroutines writing through pool, each every period,
// until the test ends or stop.
func startWriter(t *testing.T, pool acquirer, n int, period time.Duration) *writer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &writer{cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			tick := time.NewTicker(period)
			defer tick.Stop()
			for ctx.Err() == nil {
				w.writeOnce(ctx, pool)
				select {
				case <-ctx.Done():
				case <-tick.C:
				}
			}
		})
	}
	go func() {
		wg.Wait()
		close(w.done)
	}()
	t.Cleanup(w.stop)
	return w
}

func (w *writer) stop() {
	w.cancel()
	<-w.done
}

func (w *writer) writeOnce(ctx context.Context, pool acquirer) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := pool.Acquire(ctx)
	w.mu.Lock()
	w.attempts++
	w.mu.Unlock()
	if err != nil {
		w.failed(err)
		return
	}
	defer c.Release()
	acquired := time.Now()
	addr, _ := remoteAddr(c.Conn().PgConn().Conn())
	if _, err := c.Exec(ctx, "INSERT INTO w DEFAULT VALUES"); err != nil {
		w.failed(err)
		return
	}
	w.mu.Lock()
	w.commits = append(w.commits, commit{acquired: acquired, done: time.Now(), addr: addr})
	w.mu.Unlock()
}

func (w *writer) failed(err error) {
	w.mu.Lock()
	w.lastErr = err
	w.mu.Unlock()
}

// snapshot returns the commits so far and the attempts.
func (w *writer) snapshot() ([]commit, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]commit(nil), w.commits...), w.attempts
}

// firstOn returns the first commit on addr done after since.
func (w *writer) firstOn(addr netip.AddrPort, since time.Time) (commit, bool) {
	cs, _ := w.snapshot()
	for _, c := range cs {
		if c.addr == addr && !c.done.Before(since) {
			return c, true
		}
	}
	return commit{}, false
}

// countOn counts the commits on addr acquired at or after since.
func (w *writer) countOn(addr netip.AddrPort, since time.Time) int {
	cs, _ := w.snapshot()
	n := 0
	for _, c := range cs {
		if c.addr == addr && !c.acquired.Before(since) {
			n++
		}
	}
	return n
}

// waitFor polls cond every few milliseconds until it holds, failing the
// test after timeout with what.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, timeout)
		}
		time.Sleep(2 * time.Millisecond) // polling a condition, with a deadline
	}
	return time.Now()
}

// waitState waits until the pool's Watcher has read status.
func waitState(t *testing.T, pool *Pool, status PrimaryStatus) time.Time {
	t.Helper()
	return waitFor(t, 10*time.Second, fmt.Sprintf("the Watcher reads state=%s", status), func() bool {
		return pool.Watcher().PrimaryState().Status == status
	})
}

// waitAttempts waits until the writer made n more attempts.
func (w *writer) waitAttempts(t *testing.T, n int) {
	t.Helper()
	_, start := w.snapshot()
	waitFor(t, 20*time.Second, fmt.Sprintf("%d more write attempts", n), func() bool {
		_, a := w.snapshot()
		return a >= start+n
	})
}

// resolutions returns how many resolutions of the watched name began.
func (w *Watcher) resolutions() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.started
}

// writerPool opens a pool for primary.local through the zone's DNS server.
func writerPool(t *testing.T, dns *discoverytest.Server, opts WatchOptions) *Pool {
	t.Helper()
	cl, err := New(Config{Servers: []string{dns.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	pool, err := cl.NewPool(t.Context(), "postgres://postgres@primary.local.pgcluster.lan/postgres?sslmode=disable&connect_timeout=2", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// errConnRefusedForTest is what a dial to a closed port returns.
var errConnRefusedForTest = &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}

// errConnResetForTest is what a read from a connection the server reset
// returns.
var errConnResetForTest = &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
