package lock

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// A status's own expiry, with StatusTTLEvery, is set when a write creates
// the status and when its version enters a new period, not at every
// write: a holder rewrites its statuses at every probe, and pushing back
// an expiry of an hour every two seconds was one of the seven commands
// each status write ran in Redis.
func TestStatusExpiryPerPeriod(t *testing.T) {
	s := redistest.Start(t)
	l := holder(t, s, "k")
	rdb := s.Client(t)
	ctx := context.Background()
	key := statusKey("test:", "k")
	const every = 500 * time.Millisecond
	write := func(v int64, o WriteOptions) {
		t.Helper()
		got, ok, err := l.WriteVersioned(ctx, "k", v, func(int64) []byte { return []byte("up") }, o)
		if err != nil || !ok || got != v {
			t.Fatalf("WriteVersioned(%d) = %d, %v, %v", v, got, ok, err)
		}
	}
	ttl := func() time.Duration {
		t.Helper()
		d, err := rdb.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	shorten := func() {
		t.Helper()
		if err := rdb.PExpire(ctx, key, 100*time.Second).Err(); err != nil {
			t.Fatal(err)
		}
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	us := every.Microseconds()
	start := now.UnixMicro() / us * us // the period Redis's clock is in
	o := WriteOptions{StatusTTL: time.Hour, StatusTTLEvery: every}

	write(start+1, o)
	if d := ttl(); d < 59*time.Minute {
		t.Fatalf("the write that created the status set its expiry to %v, want an hour", d)
	}
	shorten()
	write(start+2, o)
	if d := ttl(); d > 100*time.Second {
		t.Errorf("a write in the same period pushed the expiry back to %v", d)
	}
	write(start+us+1, o) // the next period (within a second of Redis's clock: not ahead)
	if d := ttl(); d < 59*time.Minute {
		t.Errorf("a write in a new period left the expiry at %v, want an hour", d)
	}
	shorten()
	write(start+us+2, WriteOptions{StatusTTL: time.Hour})
	if d := ttl(); d < 59*time.Minute {
		t.Errorf("without StatusTTLEvery, a write left the expiry at %v, want an hour", d)
	}
	// Deleted meanwhile (anyone's write): the next write creates it again.
	if err := rdb.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	write(start+us+3, o)
	if d := ttl(); d < 59*time.Minute {
		t.Errorf("the write that created the status again set its expiry to %v, want an hour", d)
	}
}

// A running instance does not push its statuses' expiry back at every
// probe: an expiry shortened by hand stays as it is over several writes
// (unless their versions entered a new period meanwhile).
func TestCoordinatorStatusExpiryNotEveryWrite(t *testing.T) {
	s := redistest.Start(t)
	rdb := newClient(t, s)
	_, targets := newBackends(t, 1)
	startInstance(t, rdb, targets)
	ctx := context.Background()
	key := statusKey("fleet:", targets[0].Key)
	version := func() int64 {
		v, _ := rdb.HGet(ctx, key, "v").Result()
		n, _ := strconv.ParseInt(v, 10, 64)
		return n
	}
	eventually(t, 10*time.Second, "no status written", func() bool { return version() > 0 })
	if err := rdb.PExpire(ctx, key, 100*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	v0 := version()
	var v1 int64
	eventually(t, 10*time.Second, "the status was not written again three times", func() bool {
		v1 = version()
		return v1 > v0+2*fleetInterval.Microseconds()
	})
	d, err := rdb.PTTL(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	period := statusTTLEvery.Microseconds()
	if d > 100*time.Second && v0/period == v1/period {
		t.Errorf("the status's expiry is %v after writes from version %d to %d, in one period: each write pushed it back", d, v0, v1)
	}
}
