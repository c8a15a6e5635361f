package health

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// recorder collects the Views a Checker publishes and fails the test if two
// publish calls overlap.
type recorder struct {
	t        testing.TB
	slow     time.Duration // each publish takes this long
	inFlight atomic.Int32

	mu    sync.Mutex
	views []View
	times []time.Time
}

func (r *recorder) publish(v View) {
	if n := r.inFlight.Add(1); n != 1 {
		r.t.Errorf("publish called concurrently (%d calls in flight)", n)
	}
	defer r.inFlight.Add(-1)
	r.mu.Lock()
	r.views = append(r.views, v)
	r.times = append(r.times, time.Now())
	r.mu.Unlock()
	if r.slow > 0 {
		time.Sleep(r.slow)
	}
}

// last returns the latest View (nil before the first) and how many were published.
func (r *recorder) last() (View, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.views) == 0 {
		return View{}, 0
	}
	return r.views[len(r.views)-1], len(r.views)
}

// waitVerdict waits until the latest View satisfies cond for key and returns that verdict.
func (r *recorder) waitVerdict(key string, timeout time.Duration, cond func(Verdict, bool) error) Verdict {
	r.t.Helper()
	var got Verdict
	err := pgtest.WaitFor(timeout, func() error {
		v, _ := r.last()
		var ok bool
		got, ok = v.Get(key)
		return cond(got, ok)
	})
	if err != nil {
		r.t.Fatalf("target %q: %v", key, err)
	}
	return got
}

// isState is a waitVerdict condition: key is in the View in state s with cause.
func isState(s State, cause string) func(Verdict, bool) error {
	return func(v Verdict, ok bool) error {
		if !ok {
			return fmt.Errorf("not in the View, want %v/%s", s, cause)
		}
		if v.State != s || v.Cause != cause {
			return fmt.Errorf("verdict %v/%s (%s), want %v/%s", v.State, v.Cause, v.Detail, s, cause)
		}
		return nil
	}
}

// absent is a waitVerdict condition: key is not in the View.
func absent(v Verdict, ok bool) error {
	if ok {
		return fmt.Errorf("still in the View as %v/%s", v.State, v.Cause)
	}
	return nil
}

// start runs c until the test ends (or stop is called) and returns the recorder and stop,
// which cancels Run and waits for it to return.
func start(t *testing.T, c *Checker, slow time.Duration) (*recorder, func()) {
	t.Helper()
	rec := &recorder{t: t, slow: slow}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, rec.publish)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Errorf("Run did not return within 5s of its context being cancelled")
			}
		})
	}
	t.Cleanup(stop)
	return rec, stop
}

// mustNew is New that fails the test on error.
func mustNew(t testing.TB, cfg Config) *Checker {
	t.Helper()
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%+v): %v", cfg, err)
	}
	return c
}

// server is a TCP listener the test owns. It accepts connections and reads
// (and discards) whatever they send without ever answering, until the peer
// closes, so it counts the connections the checker left open. With a
// reply, it reads what a connection first sends, writes reply and closes it.
type server struct {
	t     testing.TB
	ln    net.Listener
	addr  netip.AddrPort
	reply []byte

	open     atomic.Int32 // connections accepted and not yet closed by the peer
	accepted atomic.Int32
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
}

// listen starts a server on addr ("127.0.0.1:0" for any port).
func listen(t testing.TB, addr string) *server {
	t.Helper()
	return listenReply(t, addr, nil)
}

// listenReply starts a server on addr that answers every connection with reply.
func listenReply(t testing.TB, addr string, reply []byte) *server {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	s := &server{t: t, ln: ln, addr: ln.Addr().(*net.TCPAddr).AddrPort(), reply: reply, conns: map[net.Conn]struct{}{}}
	s.wg.Go(s.accept)
	t.Cleanup(s.close)
	return s
}

func (s *server) accept() {
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.accepted.Add(1)
		if s.reply != nil {
			conn.SetReadDeadline(time.Now().Add(time.Second))
			conn.Read(make([]byte, 512))
			conn.Write(s.reply)
			conn.Close()
			continue
		}
		s.open.Add(1)
		s.mu.Lock()
		s.conns[conn] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() {
			buf := make([]byte, 512)
			for {
				if _, err := conn.Read(buf); err != nil {
					break
				}
			}
			s.open.Add(-1)
			s.mu.Lock()
			delete(s.conns, conn)
			s.mu.Unlock()
			conn.Close()
		})
	}
}

// close stops accepting (the port then refuses) and closes the connections left.
func (s *server) close() {
	s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// waitOpen waits until exactly n accepted connections are open.
func (s *server) waitOpen(n int32, timeout time.Duration) error {
	return pgtest.WaitFor(timeout, func() error {
		if got := s.open.Load(); got != n {
			return fmt.Errorf("%d connections open on %v, want %d", got, s.addr, n)
		}
		return nil
	})
}

// refusedAddr returns a loopback address and port nothing listens on.
func refusedAddr(t testing.TB) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := ln.Addr().(*net.TCPAddr).AddrPort()
	ln.Close()
	return a
}

// waitGoroutines waits until no more goroutines run than baseline.
func waitGoroutines(t testing.TB, baseline int, timeout time.Duration) {
	t.Helper()
	err := pgtest.WaitFor(timeout, func() error {
		if n := runtime.NumGoroutine(); n > baseline {
			return fmt.Errorf("%d goroutines, baseline %d", n, baseline)
		}
		return nil
	})
	if err != nil {
		buf := make([]byte, 1<<20)
		t.Fatalf("goroutines leaked: %v\n%s", err, buf[:runtime.Stack(buf, true)])
	}
}

// bubbleRun is a Checker run inside a synctest bubble over targets whose
// probes take no time and succeed, each probe's start recorded by target;
// its Shared is a localShared probing the first held targets (all of
// them once local).
type bubbleRun struct {
	c      *Checker
	sh     *localShared
	ts     []Target
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	probes [][]time.Time // by target
}

// startBubble runs a Checker of cfg (its Shared set here) over n targets,
// the i-th named key(i).
func startBubble(t *testing.T, n, held int, cfg Config, key func(i int) string) *bubbleRun {
	r := &bubbleRun{sh: &localShared{held: held, ports: map[netip.AddrPort]int{}}, probes: make([][]time.Time, n), done: make(chan struct{})}
	cfg.Shared = r.sh
	r.c = mustNew(t, cfg)
	r.c.probe = func(_ context.Context, addr netip.AddrPort) result {
		r.mu.Lock()
		defer r.mu.Unlock()
		i := r.sh.ports[addr]
		r.probes[i] = append(r.probes[i], time.Now())
		return result{cause: CauseOK}
	}
	for i := range n {
		addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(1000+i))
		r.sh.ports[addr] = i
		r.ts = append(r.ts, Target{Key: key(i), Addr: addr})
	}
	r.c.SetTargets(r.ts)
	var ctx context.Context
	ctx, r.cancel = context.WithCancel(context.Background())
	go func() {
		defer close(r.done)
		r.c.Run(ctx, nil)
	}()
	return r
}

// stop ends the run and waits for it.
func (r *bubbleRun) stop() {
	r.cancel()
	<-r.done
}
