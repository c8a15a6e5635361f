package lock

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const vetSecret = "0123456789abcdef0123"

// A registry lease no follower could have written (SET without a TTL, a
// TTL beyond the lease's, a value that is no token) is free: the next
// instance that may take it does, and the fleet follows the registry
// again. A genuine lease of another instance is kept.
func TestRegistryCopyLeaseWithoutTTL(t *testing.T) {
	ctx := context.Background()
	rs, a, b := newCopies(t, vetSecret)
	rdb := rs.Client(t)
	lease := leaseKey("p:", registryLease)
	for _, forged := range []struct {
		what  string
		value string
		ttl   time.Duration
	}{
		{"no TTL", "fakeholder", 0},
		{"a token's length, no TTL", strings.Repeat("a", 2*tokenBytes), 0},
		{"an hour's TTL", strings.Repeat("b", 2*tokenBytes), time.Hour},
		{"no token, a lease's TTL", "fakeholder", copyTTL},
	} {
		if err := rdb.Set(ctx, lease, forged.value, forged.ttl).Err(); err != nil {
			t.Fatal(err)
		}
		p, err := b.Poll(ctx, false, copyTTL)
		if err != nil || p.Taken || p.Holder != "" || p.Left != 0 {
			t.Errorf("%s: a poll that may not take it reads %+v %v, want nobody holding it", forged.what, p, err)
		}
		p, err = a.Poll(ctx, true, copyTTL)
		if err != nil || !p.Taken || p.Holder != a.Token() {
			t.Fatalf("%s: poll that may take it: %+v %v", forged.what, p, err)
		}
		if ttl, err := rdb.PTTL(ctx, lease).Result(); err != nil || ttl <= 0 || ttl > copyTTL {
			t.Errorf("%s: the lease taken has TTL %v %v", forged.what, ttl, err)
		}
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// A genuine holder's lease stays its own.
	if p, err := a.Poll(ctx, true, copyTTL); err != nil || !p.Taken {
		t.Fatalf("take: %+v %v", p, err)
	}
	if p, err := b.Poll(ctx, true, copyTTL); err != nil || p.Taken || p.Holder != a.Token() || p.Left <= 0 {
		t.Errorf("a genuine lease: %+v %v, want held by %s", p, err, short8(a.Token()))
	}
}

func short8(s string) string { return s[:min(8, len(s))] }

// A version stored ahead of Redis's clock (the largest int64, or
// 99999999999, which as a SOA serial mod 2^32 is below today's) is no
// version: a reader refuses the copy, the follower's renewal finds it, and
// a full write replaces it whatever its number, with the follower's own
// next version, not one above the forged one. A version ahead of the
// clock is not written either.
func TestRegistryCopyVersionAhead(t *testing.T) {
	ctx := context.Background()
	rs, a, b := newCopies(t, vetSecret)
	rdb := rs.Client(t)
	now := time.Now()
	w := take(t, a, fields("a", "1"), now.Unix())
	r, err := b.Read(ctx, &CopyState{})
	if err != nil {
		t.Fatal(err)
	}
	rst := r.State
	for _, forged := range []string{"9223372036854775807", "99999999999", "0", "-5", "12x", strconv.FormatInt(now.Unix()+2*CopyVersionAhead, 10)} {
		rdb.HSet(ctx, copyKey("p:"), "v", forged)
		p, err := b.Poll(ctx, false, copyTTL)
		if err != nil || p.Version != -1 {
			t.Errorf("v %s: poll reads version %d %v, want -1 (no version)", forged, p.Version, err)
		}
		var rej *CopyRejected
		if _, err := b.PollHead(p); !errors.As(err, &rej) {
			t.Errorf("v %s: the polled head: %v, want rejected", forged, err)
		}
		if _, err := b.Read(ctx, rst); !errors.As(err, &rej) {
			t.Errorf("v %s: read since the version applied: %v, want rejected", forged, err)
		}
		if _, err := b.Read(ctx, &CopyState{}); !errors.As(err, &rej) {
			t.Errorf("v %s: whole read: %v, want rejected", forged, err)
		}
		rn, err := a.Renew(ctx, w, time.Time{}, copyTTL)
		if err != nil || !rn.Held || rn.Intact {
			t.Errorf("v %s: renewal %+v %v, want held and not intact", forged, rn, err)
		}
		res, err := a.Write(ctx, w, CopyWrite{Fields: fields("a", "2"), Version: w.Version + 1, Term: w.Term}, copyTTL)
		if err != nil || res.Result != CopyDiverged || res.Stored != 0 {
			t.Errorf("v %s: delta over it: %+v %v, want diverged with stored 0", forged, res, err)
		}
		res, err = a.Write(ctx, &CopyState{}, CopyWrite{Fields: fields("a", "2"), Full: true, Version: w.Version + 1, Term: w.Term}, copyTTL)
		if err != nil || res.Result != CopyWritten {
			t.Fatalf("v %s: full write over it: %+v %v", forged, res, err)
		}
		w = res.State
		if r, err = b.Read(ctx, rst); err != nil || r.State.Version != w.Version {
			t.Fatalf("v %s: read after the rewrite: %+v %v", forged, r, err)
		}
		rst = r.State
	}
	if res, err := a.Write(ctx, w, CopyWrite{Fields: fields("a", "3"), Version: time.Now().Unix() + CopyVersionAhead + 60, Term: w.Term}, copyTTL); err != nil || res.Result != CopyAhead {
		t.Errorf("a version ahead of the clock written: %+v %v", res, err)
	}
}

// A head genuinely signed but ahead of Redis's clock (term, the time
// vouched for, the version) is refused, as is one without the secret;
// without a secret the same bounds hold.
func TestRegistryCopyHeadBounds(t *testing.T) {
	ctx := context.Background()
	for _, secret := range []string{vetSecret, ""} {
		rs, a, b := newCopies(t, secret)
		rdb := rs.Client(t)
		w := take(t, a, fields("a", "1"), time.Now().Unix())
		if _, err := b.Read(ctx, &CopyState{}); err != nil {
			t.Fatalf("secret %q: %v", secret, err)
		}
		good := w.head()
		now := time.Now()
		for what, h := range map[string]CopyHead{
			"term a minute ahead":     headWith(good, func(h *CopyHead) { h.Term = now.Add(time.Minute).UnixMicro() }),
			"alive a minute ahead":    headWith(good, func(h *CopyHead) { h.Alive = now.Add(time.Minute).UnixMicro() }),
			"alive before 1970":       headWith(good, func(h *CopyHead) { h.Alive = -1 }),
			"prev not below":          headWith(good, func(h *CopyHead) { h.Prev = h.Version }),
			"a registry name of 2 kB": headWith(good, func(h *CopyHead) { h.Registry = strings.Repeat("r", 2048) }),
		} {
			rdb.HSet(ctx, copyKey("p:"), "head", a.encodeHead(h))
			var rej *CopyRejected
			if _, err := b.Read(ctx, &CopyState{}); !errors.As(err, &rej) || !errors.Is(err, errCopyBounds) {
				t.Errorf("secret %q, %s: read %v, want rejected out of bounds", secret, what, err)
			}
			p, err := b.Poll(ctx, false, copyTTL)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.PollHead(p); !errors.Is(err, errCopyBounds) {
				t.Errorf("secret %q, %s: polled head %v, want out of bounds", secret, what, err)
			}
		}
		// A version a day and a minute ahead, head and v alike.
		ahead := headWith(good, func(h *CopyHead) { h.Version = now.Unix() + CopyVersionAhead + 60 })
		rdb.HSet(ctx, copyKey("p:"), "head", a.encodeHead(ahead), "v", ahead.Version)
		if _, err := b.Read(ctx, &CopyState{}); !errors.Is(err, errCopyBounds) {
			t.Errorf("secret %q, a version ahead: %v, want out of bounds", secret, err)
		}
	}
}

func headWith(h CopyHead, f func(*CopyHead)) CopyHead {
	f(&h)
	return h
}

// The follower's renewal finds a head that someone else wrote, and
// stores its own again at once; a copy replayed whole, genuinely signed,
// is found the same way, and the follower writes it whole.
func TestRegistryCopyRenewFindsForgery(t *testing.T) {
	ctx := context.Background()
	rs, a, b := newCopies(t, vetSecret)
	rdb := rs.Client(t)
	w := take(t, a, fields("a", "1"), time.Now().Unix())
	old, err := rdb.HGetAll(ctx, copyKey("p:")).Result()
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.Write(ctx, w, CopyWrite{Fields: fields("a", "2"), Version: w.Version + 1, Term: w.Term}, copyTTL)
	if err != nil || res.Result != CopyWritten {
		t.Fatal(res, err)
	}
	w = res.State

	rdb.HSet(ctx, copyKey("p:"), "head", "garbage")
	rn, err := a.Renew(ctx, w, time.Now(), copyTTL)
	if err != nil || !rn.Held || rn.Intact {
		t.Fatalf("renewal over a forged head: %+v %v, want not intact", rn, err)
	}
	if r, err := b.Read(ctx, &CopyState{}); err != nil || r.State.Version != w.Version {
		t.Fatalf("read after the renewal stored the head again: %+v %v", r, err)
	}
	if rn, err := a.Renew(ctx, w, time.Now(), copyTTL); err != nil || !rn.Intact {
		t.Errorf("renewal of a copy left alone: %+v %v, want intact", rn, err)
	}

	rdb.Del(ctx, copyKey("p:"))
	rdb.HSet(ctx, copyKey("p:"), old)
	if rn, err := a.Renew(ctx, w, time.Now(), copyTTL); err != nil || rn.Intact {
		t.Errorf("renewal over a copy replayed: %+v %v, want not intact", rn, err)
	}
	if v, _ := rdb.HGet(ctx, copyKey("p:"), "v").Result(); v != old["v"] {
		t.Errorf("the renewal wrote its head over another version (%s)", v)
	}
}

// Nothing larger than a follower writes is carried by a poll or a read,
// or decoded: a head, a version, a field, too many fields, a log entry
// or a message of megabytes is refused or read around, and counted.
func TestRegistryCopySizes(t *testing.T) {
	ctx := context.Background()
	rs, a, b := newCopies(t, vetSecret)
	rdb := rs.Client(t)
	w := take(t, a, fields("a", "1"), time.Now().Unix())
	r, err := b.Read(ctx, &CopyState{})
	if err != nil {
		t.Fatal(err)
	}
	rst := r.State
	saved, _ := rdb.HGetAll(ctx, copyKey("p:")).Result()
	restore := func() {
		rdb.Del(ctx, copyKey("p:"))
		rdb.HSet(ctx, copyKey("p:"), saved)
	}
	huge := strings.Repeat("x", 5<<20)
	var rej *CopyRejected

	rdb.HSet(ctx, copyKey("p:"), "head", huge)
	p, err := b.Poll(ctx, false, copyTTL)
	if err != nil || p.Head != "" {
		t.Errorf("a poll carried a head of %d bytes (%v)", len(p.Head), err)
	}
	if _, err := b.PollHead(p); !errors.As(err, &rej) {
		t.Errorf("a 5 MB head polled: %v, want rejected", err)
	}
	for _, st := range []*CopyState{rst, {}} {
		if _, err := b.Read(ctx, st); !errors.As(err, &rej) {
			t.Errorf("a 5 MB head read (from version %d): %v, want rejected", st.Version, err)
		}
	}
	restore()

	rdb.HSet(ctx, copyKey("p:"), "v", huge)
	if p, err := b.Poll(ctx, false, copyTTL); err != nil || p.Version != -1 {
		t.Errorf("a 5 MB version polled as %d %v", p.Version, err)
	}
	if _, err := b.Read(ctx, rst); !errors.As(err, &rej) {
		t.Errorf("a 5 MB version read: %v, want rejected", err)
	}
	restore()

	// A field larger than any, named in a log entry of its own.
	big := strings.Repeat("y", copyMaxField+1)
	rdb.HSet(ctx, copyKey("p:"), "f:a", big)
	rdb.ZAdd(ctx, copyLogKey("p:"), redis.Z{Score: float64(w.Version + 1), Member: strconv.FormatInt(w.Version+1, 10) + " " + strconv.FormatInt(w.Version, 10) + " =\x00a"})
	rdb.HSet(ctx, copyKey("p:"), "v", w.Version+1)
	for _, st := range []*CopyState{rst, {}} {
		if _, err := b.Read(ctx, st); !errors.As(err, &rej) || !errors.Is(err, errCopyBounds) {
			t.Errorf("a field of %d bytes read (from version %d): %v, want rejected out of bounds", len(big), st.Version, err)
		}
	}
	rdb.Del(ctx, copyLogKey("p:"))
	restore()

	// More fields than any copy holds.
	var args []any
	for i := range copyMaxFields + 1 {
		args = append(args, "f:"+strconv.Itoa(i), "1")
	}
	rdb.HSet(ctx, copyKey("p:"), args...)
	if _, err := b.Read(ctx, &CopyState{}); !errors.As(err, &rej) || !errors.Is(err, errCopyBounds) {
		t.Errorf("%d fields read: %v, want rejected out of bounds", copyMaxFields+1, err)
	}
	restore()

	// A log entry longer than any, and more entries than the log keeps:
	// the reader reads around them, whole. (The lease is taken again: the
	// writes above took longer than it lasts.)
	if p, err := a.Poll(ctx, true, copyTTL); err != nil || p.Holder != a.Token() {
		t.Fatalf("take the lease again: %+v %v", p, err)
	}
	res, err := a.Write(ctx, w, CopyWrite{Fields: fields("a", "2"), Version: w.Version + 1, Term: w.Term}, copyTTL)
	if err != nil || res.Result != CopyWritten {
		t.Fatal(res, err)
	}
	entry := strconv.FormatInt(w.Version+1, 10) + " " + strconv.FormatInt(w.Version, 10) + " =\x00a\x00" + strings.Repeat("z", copyMaxEntry)
	rdb.ZAdd(ctx, copyLogKey("p:"), redis.Z{Score: float64(w.Version + 1), Member: entry})
	if r, err := b.Read(ctx, rst); err != nil || !r.Full || string(r.Fields["a"]) != "2" {
		t.Errorf("read past a log entry of %d bytes: %+v %v, want the copy whole", len(entry), r, err)
	}
	var zs []redis.Z
	for i := range 5000 {
		zs = append(zs, redis.Z{Score: float64(w.Version) + 0.5, Member: "junk " + strconv.Itoa(i)})
	}
	rdb.ZAdd(ctx, copyLogKey("p:"), zs...)
	if r, err := b.Read(ctx, rst); err != nil || !r.Full {
		t.Errorf("read past 5,000 log entries: %+v %v, want the copy whole", r, err)
	}

	// Messages: a version is heard, anything else goes to bad unread.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	var heard []int64
	var bad []string
	go b.Watch(wctx, func(v int64) {
		mu.Lock()
		heard = append(heard, v)
		mu.Unlock()
	}, func(err error) {
		mu.Lock()
		bad = append(bad, err.Error())
		mu.Unlock()
	})
	eventually(t, 5*time.Second, "the subscription was not announced", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(heard) > 0
	})
	for _, m := range []string{huge, "garbage", "-1", "0", "007", "9223372036854775808", "42"} {
		rdb.Publish(ctx, copyChannel("p:"), m)
	}
	eventually(t, 5*time.Second, "version 42 was not heard", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return heard[len(heard)-1] == 42
	})
	mu.Lock()
	defer mu.Unlock()
	if len(bad) != 6 || len(heard) != 2 {
		t.Errorf("heard %v, refused %d messages (want 6)", heard, len(bad))
	}
	for _, e := range bad {
		if len(e) > 200 {
			t.Errorf("an error carries %d bytes of the message", len(e))
		}
	}
}
