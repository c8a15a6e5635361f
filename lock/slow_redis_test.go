package lock

import (
	"context"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// A Redis that answers slowly is given time by every call an instance
// makes again and again, not only by its lease and status writes: a read
// of the statuses, or a poll of the registry copy, that ran out of its
// first deadline (CallTimeout) is followed by one with a longer deadline,
// which a Redis stalled for longer than CallTimeout answers once the
// stall ends. With a fixed deadline every call failed until the stall
// ended, each closing its connection, and each next call paid a new
// connection's handshake under the same short deadline. A read of every
// status tries such a step again itself, and is answered.
func TestSlowRedisGivenTime(t *testing.T) {
	const stall = 1500 * time.Millisecond // > CallTimeout + CallTimeout: a fixed deadline fails twice
	srv := redistest.Start(t)
	ctx := t.Context()
	admin := srv.Client(t)

	// A status to read, and a registry copy's lease to poll.
	l := newLeases(t, srv)
	if ok, err := l.Acquire(ctx, "c/a", time.Minute); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if _, ok, err := l.Publish(ctx, "c/a", []byte("up")); err != nil || !ok {
		t.Fatalf("publish: %v %v", ok, err)
	}
	sub, err := NewSubscriber(srv.Client(t), "test:", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := NewRegistryCopy(srv.Client(t), "test:", []byte("0123456789abcdef0123456789abcdef"), 10*time.Second, "")
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		what string
		call func(context.Context) error
		// again: the call tries a step that ran out of time again
		// itself, with the longer deadline (see Subscriber.scan)
		again bool
	}{
		{"a read of every status", func(ctx context.Context) error {
			got, err := sub.ReadAll(ctx)
			if err == nil && len(got) != 1 {
				t.Errorf("read %d statuses, want 1", len(got))
			}
			return err
		}, true},
		{"a poll of the registry copy", func(ctx context.Context) error {
			_, err := cp.Poll(ctx, false, 10*time.Second)
			return err
		}, false},
	} {
		// Connected, and answered quickly: the next deadline is the least.
		if err := tc.call(ctx); err != nil {
			t.Fatalf("%s before the stall: %v", tc.what, err)
		}
		if err := admin.Do(ctx, "CLIENT", "PAUSE", stall.Milliseconds(), "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		if tc.again {
			if err := tc.call(ctx); err != nil {
				t.Fatalf("%s as Redis stalls for %v: %v, want it answered once the stall ends", tc.what, stall, err)
			}
			if took := time.Since(began); took < stall {
				t.Fatalf("%s answered %v into a %v stall", tc.what, took, stall)
			}
			continue
		}
		if err := tc.call(ctx); err == nil || !deadline(err) {
			t.Fatalf("%s as Redis stalls for %v: %v, want its first deadline (%v) to pass", tc.what, stall, err, CallTimeout)
		}
		if err := tc.call(ctx); err != nil {
			t.Fatalf("%s sent %v into a %v stall, after one ran out of time: %v, want it answered once the stall ends",
				tc.what, time.Since(began).Round(time.Millisecond), stall, err)
		}
		if took := time.Since(began); took < stall {
			t.Fatalf("%s answered %v into a %v stall", tc.what, took, stall)
		}
	}
}

// The deadline of a call follows the latency seen: the longest before any
// call has ended (a fleet started together finds Redis at its slowest
// then), the least after quick answers, four times a slow one within the
// bound, and the bound after a call that ran out of it.
func TestLatencyDeadline(t *testing.T) {
	var l latency
	l.most = 1500 * time.Millisecond
	for _, step := range []struct {
		took time.Duration // 0: none, the deadline before any call
		want time.Duration
	}{
		{0, 1500 * time.Millisecond},
		{time.Millisecond, CallTimeout},
		{300 * time.Millisecond, 1200 * time.Millisecond},
		{1500 * time.Millisecond, 1500 * time.Millisecond},
	} {
		if step.took > 0 {
			l.observe(step.took)
		}
		if got := l.timeout(); got != step.want {
			t.Fatalf("after a call of %v: deadline %v, want %v", step.took, got, step.want)
		}
	}
	var unbounded latency
	if got := unbounded.timeout(); got != MaxCallTimeout {
		t.Fatalf("before any call, with no bound set: %v, want %v", got, MaxCallTimeout)
	}
}
