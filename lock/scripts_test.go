package lock

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// The scripts run once per key go by their SHA1 alone, and still run when
// Redis has forgotten them (a restart, SCRIPT FLUSH).
func TestScriptsBySHA(t *testing.T) {
	s := redistest.Start(t)
	l := newLeases(t, s)
	admin := s.Client(t)
	ctx := context.Background()
	keys := []string{"a", "b", "c"}

	flush := func() {
		t.Helper()
		if err := admin.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
	}
	take := func(what string) {
		t.Helper()
		taken, _, err := l.TakeAll(ctx, keys, 10*time.Second, nil, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !slices.Equal(taken, keys) {
			t.Fatalf("%s: took %v, want %v", what, taken, keys)
		}
	}

	flush()
	take("TakeAll with the script cache empty")
	evals := redisCalls(t, admin)["eval"]
	if evals != int64(len(keys)) {
		t.Errorf("%d EVALs with the script cache empty, want %d (the calls Redis did not know, sent again)", evals, len(keys))
	}
	take("TakeAll again")
	if n := redisCalls(t, admin)["eval"]; n != evals {
		t.Errorf("TakeAll sent %d EVALs with the script cached, want none (EVALSHA)", n-evals)
	}

	// A read of statuses, then a release, each after the cache is emptied.
	for _, k := range keys {
		if err := admin.HSet(ctx, statusKey(l.prefix, k), "v", "1", "s", "x").Err(); err != nil {
			t.Fatal(err)
		}
	}
	flush()
	var names []string
	for _, k := range keys {
		names = append(names, statusKey(l.prefix, k))
	}
	got, err := readStatuses(ctx, admin, l.prefix, names)
	if err != nil || len(got) != len(keys) {
		t.Fatalf("readStatuses after SCRIPT FLUSH: %d of %d (%v)", len(got), len(keys), err)
	}
	for i, st := range got {
		if st.Key != keys[i] || st.Version != 1 || string(st.Status) != "x" || st.Err != nil {
			t.Errorf("status %d read as %+v", i, st)
		}
	}
	flush()
	if err := l.ReleaseAll(ctx, keys); err != nil {
		t.Fatalf("ReleaseAll after SCRIPT FLUSH: %v", err)
	}
	if n, err := admin.Exists(ctx, leaseKey(l.prefix, "a"), leaseKey(l.prefix, "b"), leaseKey(l.prefix, "c")).Result(); err != nil || n != 0 {
		t.Errorf("%d leases left after ReleaseAll (%v)", n, err)
	}
	if n := redisCalls(t, admin)["evalsha"]; n < int64(4*len(keys)) {
		t.Errorf("%d EVALSHAs, want at least %d: every call goes by its SHA1 first", n, 4*len(keys))
	}
}

// BenchmarkTakeAll takes (extends) the leases of 10,000 keys in one call,
// as a member that joins a fleet of 10,000 targets does, and reports
// Redis's own CPU per call beside the caller's time.
func BenchmarkTakeAll(b *testing.B) {
	s := redistest.Start(b)
	l, err := NewLeases(s.Client(b), "bench:")
	if err != nil {
		b.Fatal(err)
	}
	admin := s.Client(b)
	ctx := context.Background()
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = "c/n" + strconv.Itoa(i)
	}
	cpu := func() float64 {
		st, err := readRedisStats(ctx, admin)
		if err != nil {
			b.Fatal(err)
		}
		return st.cpu
	}
	if _, _, err := l.TakeAll(ctx, keys, time.Minute, nil, nil, nil); err != nil {
		b.Fatal(err)
	}
	before := cpu()
	for b.Loop() {
		if _, _, err := l.TakeAll(ctx, keys, time.Minute, nil, nil, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric((cpu()-before)*1e3/float64(b.N), "redis-ms/op")
}
