package lock

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// backend is a TCP listener that counts the connections (probes) it accepts.
type backend struct {
	ln       net.Listener
	addr     netip.AddrPort
	accepted atomic.Int64
}

func newBackend(t *testing.T) *backend {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &backend{ln: ln, addr: ln.Addr().(*net.TCPAddr).AddrPort()}
	go b.serve()
	t.Cleanup(func() { b.ln.Close() })
	return b
}

// newBackends returns k backends and their targets, keys "c/n0"... in order.
func newBackends(t *testing.T, k int) ([]*backend, []health.Target) {
	t.Helper()
	var bs []*backend
	var ts []health.Target
	for i := range k {
		b := newBackend(t)
		bs = append(bs, b)
		ts = append(ts, health.Target{Key: fmt.Sprintf("c/n%d", i), Addr: b.addr})
	}
	return bs, ts
}

func (b *backend) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		b.accepted.Add(1)
		c.Close()
	}
}

// instance is one member of a test fleet: a checker and its coordinator.
type instance struct {
	coord  *Coordinator
	check  *health.Checker
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	view  health.View
	views int // Views applied
}

const (
	fleetInterval = 100 * time.Millisecond
	fleetTimeout  = 50 * time.Millisecond
)

// startInstance starts a fleet member on rdb checking targets, until the
// test ends or stop is called.
func startInstance(t *testing.T, rdb redis.UniversalClient, targets []health.Target, opts ...func(*Config)) *instance {
	t.Helper()
	cfg := Config{Prefix: "fleet:", Interval: fleetInterval, Timeout: fleetTimeout, Resync: time.Second, Logf: t.Logf}
	for _, o := range opts {
		o(&cfg)
	}
	return startChecked(t, rdb, targets, cfg, health.Config{Check: health.CheckTCP, Interval: fleetInterval, Timeout: fleetTimeout, Rise: 1, Fall: 1})
}

// startChecked starts a fleet member with the coordinator cfg and the
// checks hc (its Shared is the coordinator) on rdb, until the test ends or
// stop is called.
func startChecked(t *testing.T, rdb redis.UniversalClient, targets []health.Target, cfg Config, hc health.Config) *instance {
	t.Helper()
	return startCheckedWith(t, rdb, targets, cfg, hc, nil)
}

// startCheckedWith is startChecked, calling setup, when given, with the
// coordinator before anything runs.
func startCheckedWith(t *testing.T, rdb redis.UniversalClient, targets []health.Target, cfg Config, hc health.Config, setup func(*Coordinator)) *instance {
	t.Helper()
	coord, err := NewCoordinator(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if setup != nil {
		setup(coord)
	}
	hc.Shared = coord
	check, err := health.New(hc)
	if err != nil {
		t.Fatal(err)
	}
	coord.SetProbeNow(check.ProbeNow)
	coord.SetProbeAtPhase(check.ProbeAtPhase)
	coord.SetRecheck(check.Recheck, check.RecheckAll)
	coord.SetTargets(targets)
	check.SetTargets(targets)
	return runInstance(t, coord, check)
}

// runInstance runs coord, and check unless nil (a passive instance), until
// the test ends or stop is called.
func runInstance(t *testing.T, coord *Coordinator, check *health.Checker) *instance {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{coord: coord, check: check, cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	if check != nil {
		wg.Go(func() { check.Run(ctx, nil) })
	}
	wg.Go(func() {
		coord.Run(ctx, func(v health.View) {
			in.mu.Lock()
			in.view = v
			in.views++
			in.mu.Unlock()
		})
	})
	go func() { wg.Wait(); close(in.done) }()
	t.Cleanup(in.stop)
	return in
}

func (in *instance) stop() {
	in.cancel()
	<-in.done
}

func (in *instance) state(key string) health.State {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.view.At(key).State
}

// newClient returns a client of s with the deadlines a fleet member's has,
// each of opts applied to its options (a user and password, say), closed
// when the test ends.
func newClient(t *testing.T, s *redistest.Server, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true,
		DialTimeout: CallTimeout, ReadTimeout: CallTimeout, WriteTimeout: CallTimeout}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

func allState(ins []*instance, targets []health.Target, want health.State) func() bool {
	return func() bool {
		for _, in := range ins {
			for _, tg := range targets {
				if in.state(tg.Key) != want {
					return false
				}
			}
		}
		return true
	}
}

func totalHeld(ins []*instance) (total, most int) {
	for _, in := range ins {
		n := len(in.coord.Held())
		total += n
		most = max(most, n)
	}
	return total, most
}

// Three instances on one Redis share the checks of twelve backends: every
// lease is held by exactly one of them, not all by one; each backend is
// probed about once per interval, not three times; a backend that goes
// down is down in every instance's view; an instance that stops hands its
// leases over; with Redis stopped every instance checks every backend
// itself, and when Redis is back they coordinate again.
func TestCoordinatorFleet(t *testing.T) {
	srv := redistest.Start(t)
	backends, targets := newBackends(t, 12)
	var ins []*instance
	for range 3 {
		ins = append(ins, startInstance(t, newClient(t, srv), targets))
	}
	eventually(t, 10*time.Second, "every instance sees every backend up", allState(ins, targets, health.Up))
	eventually(t, 10*time.Second, "every lease held once, spread over the instances", func() bool {
		total, most := totalHeld(ins)
		return total == len(targets) && most < len(targets)
	})
	for _, in := range ins {
		if m := in.coord.Mode(); m != ModeCoordinated {
			t.Fatalf("mode %q, want coordinated", m)
		}
	}

	// Deduplication: over a window, each backend is probed about once per
	// interval (three probers would make three times as many).
	for _, b := range backends {
		b.accepted.Store(0)
	}
	const window = 2 * time.Second
	time.Sleep(window) // a measurement window, not a synchronisation
	single := float64(window / fleetInterval)
	for i, b := range backends {
		n := float64(b.accepted.Load())
		if n < 0.5*single || n > 1.6*single {
			t.Errorf("backend %d probed %v times in %v, want about %v (one prober)", i, n, window, single)
		}
	}

	// A backend goes down: every instance's view says so.
	backends[0].ln.Close()
	eventually(t, 5*time.Second, "every instance sees the closed backend down", allState(ins, targets[:1], health.Down))

	// An instance stops: the others hold every lease between them.
	ins[2].stop()
	eventually(t, 5*time.Second, "the two left hold every lease", func() bool {
		total, _ := totalHeld(ins[:2])
		return total == len(targets)
	})

	// Redis stops: both go local and check everything themselves.
	srv.Stop()
	eventually(t, 5*time.Second, "local mode without Redis", func() bool {
		return ins[0].coord.Mode() == ModeLocal && ins[1].coord.Mode() == ModeLocal
	})
	for _, b := range backends[1:] {
		b.accepted.Store(0)
	}
	eventually(t, 5*time.Second, "every backend probed by both instances", func() bool {
		for _, b := range backends[1:] {
			if b.accepted.Load() < 4 {
				return false
			}
		}
		return true
	})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "coordinated again, every lease held once", func() bool {
		total, _ := totalHeld(ins[:2])
		return ins[0].coord.Mode() == ModeCoordinated && ins[1].coord.Mode() == ModeCoordinated && total == len(targets)
	})
	if !allState(ins[:2], targets[:1], health.Down)() || !allState(ins[:2], targets[1:], health.Up)() {
		t.Errorf("views after Redis came back do not match the backends")
	}
}
