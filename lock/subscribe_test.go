package lock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// entry is one call of apply.
type entry struct {
	key     string
	version int64
	status  string
}

// collector records what a subscriber applies.
type collector struct {
	mu   sync.Mutex
	got  []entry
	errs []error
}

func (c *collector) apply(key string, v int64, status []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.got = append(c.got, entry{key, v, string(status)})
}

func (c *collector) onError(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errs = append(c.errs, err)
}

func (c *collector) has(e entry) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, g := range c.got {
		if g == e {
			return true
		}
	}
	return false
}

func (c *collector) all() []entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]entry(nil), c.got...)
}

func (c *collector) errors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
}

// gate is a dialer that can be closed, making Redis unreachable for the
// client that uses it.
type gate struct {
	closed  atomic.Bool
	refused atomic.Int64 // dials refused so far
}

func (g *gate) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if g.closed.Load() {
		g.refused.Add(1)
		return nil, errors.New("test gate closed: Redis unreachable")
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// subscribe runs a subscriber under prefix "test:" until the test ends, on
// a client of its own dialing through g.
func subscribe(t *testing.T, s *redistest.Server, g *gate, resync time.Duration) *collector {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true, Dialer: g.dial})
	t.Cleanup(func() { _ = c.Close() })
	_, col := runSubscriber(t, c, resync)
	return col
}

// runSubscriber runs a subscriber under prefix "test:" on rdb until the
// test ends, collecting what it applies and the errors it reports.
func runSubscriber(t *testing.T, rdb redis.UniversalClient, resync time.Duration) (*Subscriber, *collector) {
	t.Helper()
	sub, err := NewSubscriber(rdb, "test:", resync)
	if err != nil {
		t.Fatal(err)
	}
	col := &collector{}
	sub.OnError = col.onError
	sub.OnReject = func(_ string, err error) { col.onError(err) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Subscribe(ctx, col.apply) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Subscribe returned %v, want context.Canceled", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Subscribe did not return within 5s of its context's end")
		}
	})
	return sub, col
}

// holder returns leases holding key, for publishing.
func holder(t *testing.T, s *redistest.Server, key string) *Leases {
	t.Helper()
	l := newLeases(t, s)
	if ok, err := l.Acquire(context.Background(), key, time.Minute); !ok || err != nil {
		t.Fatalf("Acquire(%q) = %v, %v", key, ok, err)
	}
	return l
}

func publish(t *testing.T, l *Leases, key, status string) int64 {
	t.Helper()
	v, ok, err := l.Publish(context.Background(), key, []byte(status))
	if err != nil || !ok {
		t.Fatalf("Publish(%q, %q) = %d, %v, %v", key, status, v, ok, err)
	}
	return v
}

func waitApplied(t *testing.T, col *collector, e entry) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !col.has(e) {
		if time.Now().After(deadline) {
			t.Fatalf("after 5s: %+v never applied; applied: %+v", e, col.all())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A subscriber applies what was stored before it started (cold start), then
// every published status; stale and malformed messages are dropped.
func TestSubscribeColdStartLiveAndStale(t *testing.T) {
	s := redistest.Start(t)
	l := holder(t, s, "k1")
	v1 := publish(t, l, "k1", "up")
	col := subscribe(t, s, &gate{}, time.Minute)
	waitApplied(t, col, entry{"k1", v1, "up"}) // from the first subscription's resync

	v2 := publish(t, l, "k1", "down")
	waitApplied(t, col, entry{"k1", v2, "down"})
	l2 := holder(t, s, "with space {and} braces")
	vb := publish(t, l2, "with space {and} braces", "bin\x00ary\nstatus")
	waitApplied(t, col, entry{"with space {and} braces", vb, "bin\x00ary\nstatus"})

	// A stale version, and a message no publisher of ours writes, straight
	// on the channel; then a fresh one. Messages arrive in order, so once
	// the fresh one is applied the others have been handled.
	raw := s.Client(t)
	ctx := context.Background()
	if err := raw.Publish(ctx, channel("test:"), "1 2 k1up-again").Err(); err != nil {
		t.Fatal(err)
	}
	if err := raw.Publish(ctx, channel("test:"), "garbage").Err(); err != nil {
		t.Fatal(err)
	}
	v3 := publish(t, l, "k1", "up")
	waitApplied(t, col, entry{"k1", v3, "up"})
	if col.has(entry{"k1", 1, "up-again"}) {
		t.Errorf("a stale version (1, after 2) was applied: %+v", col.all())
	}
	malformed := 0
	for _, err := range col.errors() {
		if strings.Contains(err.Error(), "malformed") {
			malformed++
		}
	}
	if malformed != 1 {
		t.Errorf("errors reported = %v, want one for the malformed message", col.errors())
	}
	// Each version applied once: no duplicate from resyncs or messages.
	seen := map[entry]int{}
	for _, e := range col.all() {
		seen[e]++
		if seen[e] > 1 {
			t.Errorf("%+v applied twice", e)
		}
	}
}

// A status published while the subscriber is disconnected reaches it when
// it reconnects, through the resync on resubscription (the timer is an
// hour away).
func TestSubscribeResyncAfterDisconnect(t *testing.T) {
	s := redistest.Start(t)
	l := holder(t, s, "k")
	v1 := publish(t, l, "k", "up")
	g := &gate{}
	col := subscribe(t, s, g, time.Hour)
	waitApplied(t, col, entry{"k", v1, "up"})

	// Cut the subscriber off: no reconnect is possible until the gate opens.
	g.closed.Store(true)
	admin := s.Client(t)
	ctx := context.Background()
	if err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE pubsub: %v", err)
	}
	eventually(t, 5*time.Second, "the subscriber is still subscribed after CLIENT KILL", func() bool {
		n, err := admin.PubSubNumSub(ctx, channel("test:")).Result()
		return err == nil && n[channel("test:")] == 0
	})
	v2 := publish(t, l, "k", "down") // lost to Pub/Sub: nobody is subscribed
	if col.has(entry{"k", v2, "down"}) {
		t.Fatal("the status was applied while the subscriber was cut off")
	}

	g.closed.Store(false)
	waitApplied(t, col, entry{"k", v2, "down"})

	// And live messages flow again.
	v3 := publish(t, l, "k", "up")
	waitApplied(t, col, entry{"k", v3, "up"})
}

// Redis unreachable when the subscriber starts: it keeps trying, and
// applies every stored status once Redis can be reached.
func TestSubscribeUnreachableAtStart(t *testing.T) {
	s := redistest.Start(t)
	l := holder(t, s, "k")
	v := publish(t, l, "k", "down")
	g := &gate{}
	g.closed.Store(true)
	col := subscribe(t, s, g, time.Hour)
	eventually(t, 5*time.Second, "the subscriber never tried to reach Redis", func() bool { return g.refused.Load() >= 2 })
	if got := col.all(); len(got) != 0 {
		t.Fatalf("applied %+v while Redis was unreachable", got)
	}
	g.closed.Store(false)
	waitApplied(t, col, entry{"k", v, "down"})
}

// Redis losing its data (a restart without persistence; here FLUSHALL)
// does not make the statuses published afterwards look stale to a
// subscriber that saw the earlier ones.
func TestPublishAfterRedisLostData(t *testing.T) {
	s := redistest.Start(t)
	l := holder(t, s, "k")
	v1 := publish(t, l, "k", "up")
	col := subscribe(t, s, &gate{}, time.Hour)
	waitApplied(t, col, entry{"k", v1, "up"})

	if err := s.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
	if ok, err := l.Acquire(context.Background(), "k", time.Minute); !ok || err != nil {
		t.Fatalf("Acquire after FLUSHALL = %v, %v", ok, err)
	}
	v2 := publish(t, l, "k", "down")
	if v2 <= v1 {
		t.Fatalf("version after Redis lost its data = %d, not above the earlier %d", v2, v1)
	}
	waitApplied(t, col, entry{"k", v2, "down"})
}

// The periodic resync picks up a stored status no message announced.
func TestSubscribePeriodicResync(t *testing.T) {
	s := redistest.Start(t)
	col := subscribe(t, s, &gate{}, 100*time.Millisecond)
	ctx := context.Background()
	if err := s.Client(t).HSet(ctx, statusKey("test:", "quiet"), "v", 7, "s", "up").Err(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, col, entry{"quiet", 7, "up"})
}

func TestNewSubscriberRefuses(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := NewSubscriber(c, "test:", time.Second); err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
		t.Errorf("NewSubscriber with ContextTimeoutEnabled unset: err = %v, want one naming ContextTimeoutEnabled", err)
	}
	c2 := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer c2.Close()
	if _, err := NewSubscriber(c2, "test:", 0); err == nil {
		t.Error("NewSubscriber with resync 0 succeeded, want an error")
	}
}

func TestParseMessage(t *testing.T) {
	for _, tc := range []struct {
		in      string
		key     string
		version int64
		status  string
		ok      bool
	}{
		{"1 1 kup", "k", 1, "up", true},
		{"12 3 a bc d", "a b", 12, "c d", true},
		{"5 0 s", "", 5, "s", true},
		{"5 2 k", "", 0, "", false},
		{"0 1 kx", "", 0, "", false},
		{"x 1 kx", "", 0, "", false},
		{"1 -1 kx", "", 0, "", false},
		{"1", "", 0, "", false},
		{"", "", 0, "", false},
	} {
		key, v, st, err := parseMessage(tc.in)
		if (err == nil) != tc.ok || key != tc.key || v != tc.version || string(st) != tc.status {
			t.Errorf("parseMessage(%q) = %q, %d, %q, %v; want %q, %d, %q, ok %v", tc.in, key, v, st, err, tc.key, tc.version, tc.status, tc.ok)
		}
	}
}

// A key's last version beyond the Horizon is forgotten: a version that
// counted once (say before Redis's clock stepped back) does not make every
// later, lower one stale.
func TestSubscribeForgetsVersionsBeyondHorizon(t *testing.T) {
	s := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	sub, err := NewSubscriber(c, "test:", 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	var horizon atomic.Int64
	horizon.Store(math.MaxInt64)
	sub.Horizon = horizon.Load
	col := &collector{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); sub.Subscribe(ctx, col.apply) }()
	t.Cleanup(func() { cancel(); <-done })

	raw := s.Client(t)
	now := time.Now().UnixMicro()
	if err := raw.HSet(context.Background(), statusKey("test:", "k"), "v", now+3600e6, "s", "ahead").Err(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, col, entry{"k", now + 3600e6, "ahead"})
	horizon.Store(now + 1e6) // Redis's clock plus a bound, as a Coordinator knows it
	if err := raw.HSet(context.Background(), statusKey("test:", "k"), "v", now, "s", "real").Err(); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, col, entry{"k", now, "real"})
}

// failScans is a go-redis hook that fails the SCAN commands it is told to:
// from the nth on, fails of them in a row.
type failScans struct {
	mu           sync.Mutex
	nth, fails   int
	seen, failed int
}

func (f *failScans) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *failScans) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (f *failScans) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "scan" {
			f.mu.Lock()
			f.seen++
			fail := f.seen >= f.nth && f.failed < f.fails
			if fail {
				f.failed++
			}
			f.mu.Unlock()
			if fail {
				err := errors.New("test: this SCAN step fails")
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}

// A read of every status survives a step that fails now and then: the
// step is tried again from its cursor, and every status is read. (Begun
// again from the start a cycle later, a read of thousands of statuses on
// a loaded machine may never complete, and until the read a subscription
// calls for completes nothing any holder wrote is confirmed.) A step that
// keeps failing fails the read.
func TestScanStepTriedAgain(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	admin := s.Client(t)
	const n = 1500 // several SCAN steps of scanCount
	for i := range n {
		if err := admin.HSet(ctx, statusKey("test:", fmt.Sprintf("k%d", i)), "v", 7, "s", "up").Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		fails int
		ok    bool
	}{{2, true}, {scanStepTries, false}} {
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
		f := &failScans{nth: 2, fails: tc.fails}
		rdb.AddHook(f)
		sub, err := NewSubscriber(rdb, "test:", time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		read := map[string]bool{}
		err = sub.scan(ctx, 0, func(got []Stored) {
			for _, st := range got {
				read[st.Key] = true
			}
		})
		rdb.Close()
		switch {
		case tc.ok && (err != nil || len(read) != n):
			t.Errorf("a step failing %d times: err %v, %d of %d statuses read; want every one", tc.fails, err, len(read), n)
		case !tc.ok && err == nil:
			t.Errorf("a step failing %d times (every try): the read succeeded", tc.fails)
		}
		if f.failed != tc.fails {
			t.Errorf("%d SCAN steps failed, want %d", f.failed, tc.fails)
		}
	}
}
