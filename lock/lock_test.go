package lock

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

func newLeases(t *testing.T, s *redistest.Server) *Leases {
	t.Helper()
	l, err := NewLeases(s.Client(t), "test:")
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestLeaseAcquireRenewRelease(t *testing.T) {
	s := redistest.Start(t)
	a, b := newLeases(t, s), newLeases(t, s)
	if a.Token() == b.Token() {
		t.Fatalf("two instances drew the same token %q", a.Token())
	}
	ctx := context.Background()
	const ttl = 10 * time.Second

	must := func(what string, want bool, got bool, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if got != want {
			t.Fatalf("%s = %v, want %v", what, got, want)
		}
	}
	ok, err := a.Acquire(ctx, "k1", ttl)
	must("a.Acquire(k1)", true, ok, err)
	ok, err = b.Acquire(ctx, "k1", ttl)
	must("b.Acquire(k1) while a holds it", false, ok, err)
	ok, err = a.Acquire(ctx, "k1", ttl)
	must("a.Acquire(k1) again", false, ok, err)
	ok, err = b.Renew(ctx, "k1", ttl)
	must("b.Renew(k1) of a's lease", false, ok, err)
	ok, err = b.Release(ctx, "k1")
	must("b.Release(k1) of a's lease", false, ok, err)
	ok, err = a.Renew(ctx, "k1", ttl)
	must("a.Renew(k1)", true, ok, err)

	// Another key is independent.
	ok, err = b.Acquire(ctx, "k2", ttl)
	must("b.Acquire(k2)", true, ok, err)

	ok, err = a.Release(ctx, "k1")
	must("a.Release(k1)", true, ok, err)
	ok, err = a.Release(ctx, "k1")
	must("a.Release(k1) twice", false, ok, err)
	ok, err = a.Renew(ctx, "k1", ttl)
	must("a.Renew(k1) after release", false, ok, err)
	ok, err = b.Acquire(ctx, "k1", ttl)
	must("b.Acquire(k1) after a released it", true, ok, err)

	// The stored lease carries b's token and the TTL asked for.
	c := s.Client(t)
	if got := c.Get(ctx, leaseKey("test:", "k1")).Val(); got != b.Token() {
		t.Errorf("lease k1 holds %q, want b's token %q", got, b.Token())
	}
	if pttl := c.PTTL(ctx, leaseKey("test:", "k1")).Val(); pttl <= 0 || pttl > ttl {
		t.Errorf("lease k1 PTTL = %v, want in (0, %v]", pttl, ttl)
	}
}

func TestLeaseBadTTL(t *testing.T) {
	s := redistest.Start(t)
	a := newLeases(t, s)
	if _, err := a.Acquire(context.Background(), "k", 0); err == nil {
		t.Error("Acquire with TTL 0 succeeded, want an error")
	}
	if _, err := a.Renew(context.Background(), "k", -time.Second); err == nil {
		t.Error("Renew with a negative TTL succeeded, want an error")
	}
}

// A holder that stops renewing loses the lease when it expires; another
// instance takes it, and the old holder can neither renew, release nor
// publish.
func TestLeaseExpiryTakeoverFencing(t *testing.T) {
	s := redistest.Start(t)
	a, b := newLeases(t, s), newLeases(t, s)
	ctx := context.Background()

	start := time.Now()
	if ok, err := a.Acquire(ctx, "k", 300*time.Millisecond); !ok || err != nil {
		t.Fatalf("a.Acquire = %v, %v; want true", ok, err)
	}
	v1, ok, err := a.Publish(ctx, "k", []byte("up"))
	if err != nil || !ok || v1 <= 0 {
		t.Fatalf("a.Publish while holding = %d, %v, %v; want a positive version, true, nil", v1, ok, err)
	}

	// a is "frozen": it does not renew. b takes over after the TTL.
	eventually(t, 5*time.Second, "b never took over the expired lease", func() bool {
		ok, err := b.Acquire(ctx, "k", 10*time.Second)
		if err != nil {
			t.Fatalf("b.Acquire: %v", err)
		}
		return ok
	})
	// Measured from before a's Acquire, b cannot have succeeded earlier
	// than the TTL (less a margin for Redis's clock against ours).
	if took := time.Since(start); took < 250*time.Millisecond {
		t.Errorf("b took over %v after a acquired, before a's 300ms TTL lapsed", took)
	}
	v2, ok, err := b.Publish(ctx, "k", []byte("down"))
	if err != nil || !ok || v2 <= v1 {
		t.Fatalf("b.Publish as new holder = %d, %v, %v; want a version above %d, true, nil", v2, ok, err, v1)
	}

	// a wakes up: it is fenced off.
	if v, ok, err := a.Publish(ctx, "k", []byte("up")); err != nil || ok || v != 0 {
		t.Errorf("stale a.Publish = %d, %v, %v; want 0, false, nil", v, ok, err)
	}
	if ok, err := a.Renew(ctx, "k", time.Second); err != nil || ok {
		t.Errorf("stale a.Renew = %v, %v; want false, nil", ok, err)
	}
	if ok, err := a.Release(ctx, "k"); err != nil || ok {
		t.Errorf("stale a.Release = %v, %v; want false, nil", ok, err)
	}
	c := s.Client(t)
	got, err := c.HGetAll(ctx, statusKey("test:", "k")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if got["v"] != strconv.FormatInt(v2, 10) || got["s"] != "down" {
		t.Errorf("stored status after the stale publish = %v, want v=%d s=down (b's)", got, v2)
	}
	if holder := c.Get(ctx, leaseKey("test:", "k")).Val(); holder != b.Token() {
		t.Errorf("lease holds %q after a's stale calls, want b's token", holder)
	}
}

// Without any lease, Publish writes nothing.
func TestPublishWithoutLease(t *testing.T) {
	s := redistest.Start(t)
	a := newLeases(t, s)
	ctx := context.Background()
	if v, ok, err := a.Publish(ctx, "k", []byte("up")); err != nil || ok || v != 0 {
		t.Errorf("Publish without lease = %d, %v, %v; want 0, false, nil", v, ok, err)
	}
	if n := s.Client(t).Exists(ctx, statusKey("test:", "k")).Val(); n != 0 {
		t.Errorf("a status was stored without a lease")
	}
}

// Every Redis call is bounded: a Redis that accepts connections but never
// answers costs CallTimeout, not a hang.
func TestCallsBounded(t *testing.T) {
	// A listener that accepts and never answers, like a frozen Redis.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	c := redis.NewClient(&redis.Options{Addr: l.Addr().String(), MaxRetries: -1, ReadTimeout: time.Minute, WriteTimeout: time.Minute, ContextTimeoutEnabled: true})
	defer c.Close()
	a, err := NewLeases(c, "test:")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := a.Acquire(context.Background(), "k", time.Second); err == nil {
		t.Fatal("Acquire against a silent server succeeded")
	}
	if took := time.Since(start); took > CallTimeout+2*time.Second {
		t.Errorf("Acquire against a silent server took %v, want about CallTimeout (%v)", took, CallTimeout)
	}
}

// A client that ignores context deadlines is refused with a reason.
func TestNewLeasesRefusesClientWithoutContextTimeouts(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := NewLeases(c, "test:"); err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
		t.Errorf("NewLeases with ContextTimeoutEnabled unset: err = %v, want one naming ContextTimeoutEnabled", err)
	}
}
