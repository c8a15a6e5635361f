package lock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

const copyTTL = 3 * time.Second

func fields(kv ...string) map[string][]byte {
	m := map[string][]byte{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == "<nil>" {
			m[kv[i]] = nil
		} else {
			m[kv[i]] = []byte(kv[i+1])
		}
	}
	return m
}

func show(m map[string][]byte) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if v == nil {
			out[k] = "<nil>"
		} else {
			out[k] = string(v)
		}
	}
	return out
}

func newCopies(t *testing.T, secret string) (*redistest.Server, *RegistryCopy, *RegistryCopy) {
	t.Helper()
	rs := redistest.Start(t)
	rdb := rs.Client(t)
	a, err := NewRegistryCopy(rdb, "p:", []byte(secret), copyTTL, "")
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewRegistryCopy(rdb, "p:", []byte(secret), copyTTL, "")
	if err != nil {
		t.Fatal(err)
	}
	return rs, a, b
}

// take makes c the follower and writes a first, full copy.
func take(t *testing.T, c *RegistryCopy, f map[string][]byte, v int64) *CopyState {
	t.Helper()
	ctx := context.Background()
	p, err := c.Poll(ctx, true, copyTTL)
	if err != nil || !p.Taken || p.Holder != c.Token() {
		t.Fatalf("poll: %+v, %v", p, err)
	}
	r, err := c.Write(ctx, &CopyState{}, CopyWrite{Fields: f, Full: true, Version: v, Term: p.Now.UnixMicro()}, copyTTL)
	if err != nil || r.Result != CopyWritten {
		t.Fatalf("full write: %+v, %v", r, err)
	}
	return r.State
}

// A follower's full write and deltas reach a reader whole, then as the
// fields each version changed; a write over another version, or by an
// instance without the lease, is refused.
func TestRegistryCopyWriteRead(t *testing.T) {
	ctx := context.Background()
	_, a, b := newCopies(t, "0123456789abcdef0123")
	if _, err := b.Read(ctx, &CopyState{}); !errors.Is(err, ErrNoCopy) {
		t.Fatalf("read before any write: %v, want ErrNoCopy", err)
	}
	w := take(t, a, fields("a", "1", "b", "2"), 10)

	r, err := b.Read(ctx, &CopyState{})
	if err != nil || !r.Full || r.State.Version != 10 || !maps.Equal(show(r.Fields), map[string]string{"a": "1", "b": "2"}) {
		t.Fatalf("first read: %+v, %v", r, err)
	}
	rst := r.State

	res, err := a.Write(ctx, w, CopyWrite{Fields: fields("a", "<nil>", "b", "3", "c", "4"), Version: 11, Term: w.Term, Seen: time.Now()}, copyTTL)
	if err != nil || res.Result != CopyWritten {
		t.Fatalf("delta write: %+v, %v", res, err)
	}
	w = res.State
	r, err = b.Read(ctx, rst)
	if err != nil || r.Full || r.State.Version != 11 || !maps.Equal(show(r.Fields), map[string]string{"a": "<nil>", "b": "3", "c": "4"}) {
		t.Fatalf("delta read: %+v, %v", r, err)
	}
	if r.Head.Seen == 0 {
		t.Errorf("the head lost the time the change was seen: %+v", r.Head)
	}
	rst = r.State
	if r, err = b.Read(ctx, rst); err != nil || r.Fields != nil || r.State != rst {
		t.Fatalf("read with nothing new: %+v, %v", r, err)
	}

	// Several versions behind: one read brings what all of them changed.
	for i, v := range []string{"5", "6", "7"} {
		res, err := a.Write(ctx, w, CopyWrite{Fields: fields("d", v), Version: int64(12 + i), Term: w.Term}, copyTTL)
		if err != nil || res.Result != CopyWritten {
			t.Fatalf("write %d: %+v, %v", 12+i, res, err)
		}
		w = res.State
	}
	r, err = b.Read(ctx, rst)
	if err != nil || r.Full || r.State.Version != 14 || !maps.Equal(show(r.Fields), map[string]string{"d": "7"}) {
		t.Fatalf("read three versions behind: %+v, %v", r, err)
	}

	if res, err := b.Write(ctx, r.State, CopyWrite{Fields: fields("x", "1"), Version: 15, Term: w.Term}, copyTTL); err != nil || res.Result != CopyFenced {
		t.Fatalf("write without the lease: %+v, %v", res, err)
	}
	if res, err := a.Write(ctx, rst, CopyWrite{Fields: fields("x", "1"), Version: 15, Term: w.Term}, copyTTL); err != nil || res.Result != CopyDiverged || res.Stored != 14 {
		t.Fatalf("delta over an old version: %+v, %v", res, err)
	}
	if res, err := a.Write(ctx, &CopyState{}, CopyWrite{Fields: fields("x", "1"), Full: true, Version: 14, Term: w.Term}, copyTTL); err != nil || res.Result != CopyDiverged || res.Stored != 14 {
		t.Fatalf("full write not above the stored version: %+v, %v", res, err)
	}
	if err := a.Check(ctx, w); err != nil {
		t.Fatalf("check of the copy as written: %v", err)
	}
}

// A reader further behind than the log reaches, or behind a full write of
// a new term, reads the copy whole.
func TestRegistryCopyGap(t *testing.T) {
	ctx := context.Background()
	rs, a, b := newCopies(t, "")
	w := take(t, a, fields("a", "1"), 1)
	r, err := b.Read(ctx, &CopyState{})
	if err != nil {
		t.Fatal(err)
	}
	old := r.State
	for i := range copyLogKeep + 5 {
		res, err := a.Write(ctx, w, CopyWrite{Fields: fields("n"+strconv.Itoa(i%7), strconv.Itoa(i)), Version: w.Version + 1, Term: w.Term}, copyTTL)
		if err != nil || res.Result != CopyWritten {
			t.Fatalf("write %d: %+v, %v", i, res, err)
		}
		w = res.State
	}
	r, err = b.Read(ctx, old)
	if err != nil || !r.Full || r.State.Version != w.Version || len(r.Fields) != 8 {
		t.Fatalf("read past the log: full %v version %d (want %d), %d fields, %v", r.Full, r.State.Version, w.Version, len(r.Fields), err)
	}
	cur := r.State

	// Redis lost the copy; a new term starts again at lower versions: read
	// whole, it replaces the old one.
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := rs.Client(t)
	rdb.Del(ctx, copyKey("p:"), copyLogKey("p:"))
	nw := take(t, b, fields("z", "9"), 3)
	r, err = b.Read(ctx, cur)
	if err != nil || !r.Full || r.State.Version != 3 || r.State.Term != nw.Term || !maps.Equal(show(r.Fields), map[string]string{"z": "9"}) {
		t.Fatalf("read after a new term: %+v, %v", r, err)
	}
}

// With a secret, a copy changed by anyone without it is refused, whether
// the change comes with a version of its own or not; a copy replayed whole
// is older than the one applied; the follower's check finds both.
func TestRegistryCopyForged(t *testing.T) {
	ctx := context.Background()
	rs, a, b := newCopies(t, "0123456789abcdef0123")
	rdb := rs.Client(t)
	w := take(t, a, fields("a", "1", "b", "2"), 100)
	r, err := b.Read(ctx, &CopyState{})
	if err != nil {
		t.Fatal(err)
	}
	rst := r.State
	saved, err := rdb.HGetAll(ctx, copyKey("p:")).Result()
	if err != nil {
		t.Fatal(err)
	}

	// A field rewritten, then announced as a version of its own.
	rdb.HSet(ctx, copyKey("p:"), "f:b", "evil")
	if err := a.Check(ctx, w); err == nil {
		t.Error("the follower's check did not find a forged field")
	}
	rdb.HSet(ctx, copyKey("p:"), "v", "101")
	rdb.ZAdd(ctx, copyLogKey("p:"), redis.Z{Score: 101, Member: "101 100 =\x00b"})
	var rej *CopyRejected
	if _, err := b.Read(ctx, rst); !errors.As(err, &rej) {
		t.Fatalf("read of a forged delta: %v, want rejected", err)
	}
	if _, err := b.Read(ctx, &CopyState{}); !errors.As(err, &rej) {
		t.Fatalf("whole read of a forged copy: %v, want rejected", err)
	}
	// An unsigned head.
	rdb.HSet(ctx, copyKey("p:"), "head", `{"term":1,"v":101,"digest":"`+fmt.Sprintf("%064d", 0)+`","n":2}`)
	if _, err := b.Read(ctx, &CopyState{}); !errors.As(err, &rej) || !errors.Is(err, ErrCopyUnsigned) {
		t.Fatalf("read with an unsigned head: %v", err)
	}

	// The follower rewrites it whole; a later version replayed whole by
	// someone else is older than what the reader applied.
	res, err := a.Write(ctx, &CopyState{}, CopyWrite{Fields: fields("a", "1", "b", "5"), Full: true, Version: 102, Term: w.Term}, copyTTL)
	if err != nil || res.Result != CopyWritten {
		t.Fatalf("full rewrite: %+v, %v", res, err)
	}
	r, err = b.Read(ctx, rst)
	if err != nil || r.State.Version != 102 || string(r.Fields["b"]) != "5" {
		t.Fatalf("read after the rewrite: %+v, %v", r, err)
	}
	rdb.Del(ctx, copyKey("p:"))
	for k, v := range saved {
		rdb.HSet(ctx, copyKey("p:"), k, v)
	}
	if _, err := b.Read(ctx, r.State); !errors.Is(err, ErrCopyStale) {
		t.Fatalf("read of a copy replayed whole: %v, want stale", err)
	}
	if err := a.Check(ctx, res.State); err == nil {
		t.Error("the follower's check did not find a copy replayed whole")
	}
}

// The follower's renewal vouches for the copy's freshness in its head,
// and fails once the lease is another's.
func TestRegistryCopyRenew(t *testing.T) {
	ctx := context.Background()
	rs, a, b := newCopies(t, "0123456789abcdef0123")
	w := take(t, a, fields("a", "1"), 7)
	rn, err := a.Renew(ctx, w, time.UnixMicro(12345), copyTTL)
	if err != nil || !rn.Held || !rn.Intact || rn.Now.IsZero() {
		t.Fatalf("renew: %+v %v", rn, err)
	}
	p, err := b.Poll(ctx, true, copyTTL)
	if err != nil || p.Taken || p.Holder != a.Token() || p.Version != 7 || p.Left <= 0 || p.Left > copyTTL {
		t.Fatalf("poll: %+v %v (the lease's time left should be in (0, %v])", p, err, copyTTL)
	}
	h, err := b.DecodeHead(p.Head)
	if err != nil || h.Alive != 12345 || h.Version != 7 {
		t.Fatalf("head after renew: %+v %v", h, err)
	}
	if r, err := b.Read(ctx, &CopyState{}); err != nil || r.Head.Alive != 12345 {
		t.Fatalf("read after renew: %+v %v", r, err)
	}
	rs.Client(t).Del(ctx, leaseKey("p:", registryLease))
	if rn, err := a.Renew(ctx, w, time.Time{}, copyTTL); err != nil || rn.Held {
		t.Fatalf("renew of a lease gone: %+v %v", rn, err)
	}
}

// Watch hears each version published, and each subscription.
func TestRegistryCopyWatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, a, b := newCopies(t, "")
	var mu sync.Mutex
	var got []int64
	done := make(chan error, 1)
	go func() {
		done <- b.Watch(ctx, func(v int64) {
			mu.Lock()
			got = append(got, v)
			mu.Unlock()
		}, func(err error) { t.Errorf("a genuine version refused: %v", err) })
	}()
	heard := func(v int64) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, g := range got {
			if g == v {
				return true
			}
		}
		return false
	}
	eventually(t, 5*time.Second, "the subscription was not announced", func() bool { return heard(0) })
	take(t, a, fields("a", "1"), 42)
	eventually(t, 5*time.Second, "version 42 was not heard", func() bool { return heard(42) })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch returned %v", err)
	}
}

// A signed head is accepted only as encodeHead spells it: its signature's
// hex in upper case, or any byte of it changed, is refused, and so is an
// unsigned head or one signed with another secret.
func TestRegistryCopyHeadSpelling(t *testing.T) {
	c := &RegistryCopy{secret: []byte("0123456789abcdef0123"), lease: copyTTL}
	h := CopyHead{Term: 1, Version: 7, Prev: 6, Digest: strings.Repeat("ab", 32), Fields: 3}
	raw := c.encodeHead(h)
	if got, err := c.DecodeHead(raw); err != nil || got != h {
		t.Fatalf("the head as written: %+v %v", got, err)
	}
	sig, body, _ := strings.Cut(strings.TrimPrefix(raw, sigPrefix), " ")
	if strings.ToUpper(sig) == sig {
		t.Fatalf("signature %q has no letter to spell in upper case", sig)
	}
	bad := map[string]string{
		"upper-case hex":  sigPrefix + strings.ToUpper(sig) + " " + body,
		"unsigned":        body,
		"no body":         sigPrefix + sig,
		"other secret":    (&RegistryCopy{secret: []byte("another secret, as long")}).encodeHead(h),
		"signature short": sigPrefix + sig[:len(sig)-2] + " " + body,
	}
	for i := range len(raw) {
		b := []byte(raw)
		b[i] ^= 1
		bad[fmt.Sprintf("byte %d changed", i)] = string(b)
	}
	for what, r := range bad {
		if got, err := c.DecodeHead(r); err == nil {
			t.Errorf("%s: accepted as %+v", what, got)
		}
	}
}
