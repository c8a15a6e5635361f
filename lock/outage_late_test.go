package lock

import (
	"context"
	"testing"
	"time"
)

// A Redis call that runs out of time while this process runs late (a
// call of it ended well past its deadline: starved of CPU) is not taken
// for Redis failing while Redis answered within a lease: an instance of a
// fleet started together on too few cores stays coordinating rather than
// probing every target, which would starve it and the others further.
// Deadlines met on time still take it local after two cycles, and so do
// late ones once Redis has answered nothing for a lease.
func TestCoordinatorLateDeadlinesNoOutage(t *testing.T) {
	c := offlineCoordinator(t, Config{Prefix: "p:", Interval: 100 * time.Millisecond, Timeout: 20 * time.Millisecond, QuietModes: true})
	after := c.b.outageAfter()
	// fail fails a call begun now, a call of this process having ended
	// late meanwhile when late, and returns the mode after it.
	fail := func(late bool) string {
		start := time.Now()
		if late {
			c.leases.lat.lateAt.Store(time.Now().UnixNano())
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.failed(start, context.DeadlineExceeded)
		return c.mode
	}
	coordinating := func(answered time.Time) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.mode, c.failingSince, c.cause = ModeCoordinated, time.Time{}, nil
		c.answeredAt = answered
	}

	coordinating(time.Now())
	for end := time.Now().Add(3 * after); time.Now().Before(end); time.Sleep(after / 20) {
		if m := fail(true); m != ModeCoordinated {
			t.Fatalf("deadlines run late for %v, Redis answered %v ago: mode %q, want still coordinating", 3*after, time.Since(c.answeredAt), m)
		}
	}

	coordinating(time.Now())
	began := time.Now()
	for fail(false) == ModeCoordinated {
		if time.Since(began) > 3*after {
			t.Fatalf("deadlines met on time for %v: still coordinating, want local after %v", 3*after, after)
		}
		time.Sleep(after / 20)
	}

	coordinating(time.Now().Add(-c.b.ttl))
	began = time.Now()
	for fail(true) == ModeCoordinated {
		if time.Since(began) > 3*after {
			t.Fatalf("deadlines run late for %v, Redis answered nothing for a lease before: still coordinating, want local after %v", 3*after, after)
		}
		time.Sleep(after / 20)
	}
}

// A call that ran out of time counts as late when it ended well past its
// deadline (its process did not run it in time), not when it ended at it.
func TestCallLate(t *testing.T) {
	c := offlineCoordinator(t, Config{Prefix: "p:", Interval: 100 * time.Millisecond, Timeout: 20 * time.Millisecond})
	l := c.leases
	began := time.Now()
	ctx, done := l.call(context.Background())
	<-ctx.Done()
	done()
	if l.lat.lateSince(began) {
		t.Fatal("a call that ended at its deadline counts as late")
	}
	ctx, done = l.call(context.Background())
	<-ctx.Done()
	time.Sleep(CallTimeout/4 + 60*time.Millisecond) // descheduled past it
	done()
	if !l.lat.lateSince(began) {
		t.Fatal("a call that ended well past its deadline does not count as late")
	}
	if l.lat.lateSince(time.Now()) {
		t.Fatal("a late call counts for calls begun after it ended")
	}
}
