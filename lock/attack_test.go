package lock

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// The attack tests write into a running fleet's Redis as someone without
// redis_secret can, and check that the fleet's views still follow the
// backends: a stopped backend leaves every view within the checks' bound,
// fall × interval + timeout + lease, and a new instance never sees it up.

// attackSecret is the fleet's redis_secret in the tests that have one.
var attackSecret = []byte("0123456789abcdef-fleet")

// attackBound is the checks' bound of the test fleets (startInstance:
// fall 1, interval 100 ms, timeout 50 ms, a lease of 1 s), and
// attackMargin what a loaded test machine adds to it before a test fails.
const (
	attackBound  = fleetInterval + fleetTimeout + time.Second
	attackMargin = 2 * time.Second
)

// lineLog records the log lines of an instance, and shows them in the
// test's log.
type lineLog struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (l *lineLog) logf(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
	l.t.Log(line)
}

// count returns how many lines hold s.
func (l *lineLog) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// attackFleet is a fleet under attack: its instances, what each counted
// and logged, its backends and targets.
type attackFleet struct {
	srv      *redistest.Server
	raw      *redis.Client // the attacker's client
	secret   []byte
	ins      []*instance
	obs      []*counter
	logs     []*lineLog
	backends []*backend
	targets  []health.Target
}

// startAttackFleet starts n instances with secret (nil: none) sharing the
// checks of k backends on a Redis of their own, and waits until each
// backend is up in every view and its lease held once.
func startAttackFleet(t *testing.T, n, k int, secret []byte) *attackFleet {
	t.Helper()
	f := &attackFleet{srv: redistest.Start(t), secret: secret}
	f.raw = f.srv.Client(t)
	f.backends, f.targets = newBackends(t, k)
	for range n {
		f.start(t)
	}
	eventually(t, 10*time.Second, "every backend up in every view, each lease held by its owner", func() bool {
		return f.settled() && allState(f.ins, f.targets, health.Up)()
	})
	return f
}

// settled reports whether each target's lease is held by the instance
// the fleet gives it to, and by no other.
func (f *attackFleet) settled() bool {
	var tokens []string
	for _, in := range f.ins {
		tokens = append(tokens, in.coord.Token())
	}
	slices.Sort(tokens)
	total, _ := totalHeld(f.ins)
	for _, tg := range f.targets {
		for _, in := range f.ins {
			if in.coord.Token() == owner(tokens, tg.Key) && !slices.Contains(in.coord.Held(), tg.Key) {
				return false
			}
		}
	}
	return total == len(f.targets)
}

// start starts one more instance of the fleet.
func (f *attackFleet) start(t *testing.T) *instance {
	t.Helper()
	obs := &counter{messages: map[string]int{}}
	log := &lineLog{t: t}
	in := startInstance(t, newClient(t, f.srv), f.targets, func(c *Config) {
		c.Secret, c.Observer, c.Logf = f.secret, obs, log.logf
	})
	f.ins, f.obs, f.logs = append(f.ins, in), append(f.obs, obs), append(f.logs, log)
	return in
}

// leaves stops backend i and returns how long it took to be down in every
// view, failing t past attackBound + attackMargin.
func (f *attackFleet) leaves(t *testing.T, i int) time.Duration {
	t.Helper()
	key := f.targets[i].Key
	at := time.Now()
	f.backends[i].ln.Close()
	eventually(t, attackBound+attackMargin, key+" down in every view", func() bool {
		return allState(f.ins, f.targets[i:i+1], health.Down)()
	})
	return time.Since(at)
}

// newcomer starts one more instance and checks that, from its first View
// and for a second, it never sees backend i up.
func (f *attackFleet) newcomer(t *testing.T, i int) {
	t.Helper()
	in := f.start(t)
	key := f.targets[i].Key
	eventually(t, 5*time.Second, "the new instance makes its first View", func() bool {
		in.mu.Lock()
		defer in.mu.Unlock()
		return in.views > 0
	})
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if s := in.state(key); s == health.Up {
			t.Fatalf("an instance started after the attack sees the stopped %s up", key)
		}
	}
}

// quietLogs fails t if an instance logged a kind of line about what it
// read from Redis more than once (the tests last under a minute).
func (f *attackFleet) quietLogs(t *testing.T, words ...string) {
	t.Helper()
	for i, l := range f.logs {
		for _, w := range words {
			if n := l.count(w); n > 1 {
				t.Errorf("instance %d logged %d lines holding %q, want at most one a minute", i, n, w)
			}
		}
	}
}

func (f *attackFleet) rejected() int {
	n := 0
	for _, o := range f.obs {
		n += o.count("rejected")
	}
	return n
}

// A version written into a status's hash far in the future (10^17, past
// Lua's exact 2^53, or the largest int64), with or without the secret,
// does not keep a stopped backend in any view: the holder's write script
// treats it as absent and writes versions from Redis's clock again, the
// readers refuse it (counted as rejected, one log line), the holder's
// next statuses still count, and a new instance never sees the backend
// up. The same holds when the key is deleted afterwards, and when the
// forged version comes with a whole status of its own (which, without a
// secret, is refused for being ahead of Redis's clock).
func TestAttackFarFutureVersion(t *testing.T) {
	for _, tc := range []struct {
		name    string
		secret  []byte
		version string
	}{
		{"secret 1e17", attackSecret, "100000000000000000"},
		{"secret int64 max", attackSecret, strconv.FormatInt(math.MaxInt64, 10)},
		{"no secret 1e17", nil, "100000000000000000"},
		{"no secret int64 max", nil, strconv.FormatInt(math.MaxInt64, 10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := startAttackFleet(t, 3, 3, tc.secret)
			ctx := context.Background()
			huge, _ := strconv.ParseInt(tc.version, 10, 64)
			for _, tg := range f.targets {
				name := statusKey("fleet:", tg.Key)
				stored, err := f.raw.HGet(ctx, name, "s").Result()
				if err != nil {
					t.Fatal(err)
				}
				if err := f.raw.HSet(ctx, name, "v", tc.version).Err(); err != nil {
					t.Fatal(err)
				}
				// The genuine status, published again with the version.
				if err := f.raw.Publish(ctx, channel("fleet:"), fmt.Sprintf("%s %d %s%s", tc.version, len(tg.Key), tg.Key, stored)).Err(); err != nil {
					t.Fatal(err)
				}
				// A whole status of its own, signed as the version.
				forged := status{V: huge, Addr: tg.Addr, Holder: "forger", At: time.Now().UnixMicro(), State: "up", OK: 1}
				if err := f.raw.Publish(ctx, channel("fleet:"), fmt.Sprintf("%s %d %s%s", tc.version, len(tg.Key), tg.Key, encode(tg.Key, forged, nil))).Err(); err != nil {
					t.Fatal(err)
				}
			}
			// The holders write their versions from Redis's clock again.
			start := time.Now()
			eventually(t, 5*time.Second, "every stored version back below 2^53 and signed as stored", func() bool {
				fl, err := ReadFleet(ctx, f.raw, fleetConfig("fleet:", tc.secret), nil)
				if err != nil {
					t.Fatal(err)
				}
				for _, tg := range f.targets {
					k := fl.Keys[tg.Key]
					if k.Err != nil || k.Version >= 1<<53 || k.Stale != "" {
						return false
					}
				}
				return true
			})
			t.Logf("stored versions repaired by their holders %v after the writes", time.Since(start).Round(time.Millisecond))
			took := f.leaves(t, 0)
			t.Logf("backend stopped after a version of %s: gone from every view in %v (bound %v)", tc.version, took.Round(time.Millisecond), attackBound)

			// Deleting the key does not hold the next status back either.
			if err := f.raw.Del(ctx, statusKey("fleet:", f.targets[1].Key)).Err(); err != nil {
				t.Fatal(err)
			}
			took = f.leaves(t, 1)
			t.Logf("backend stopped after its status was deleted: gone from every view in %v", took.Round(time.Millisecond))
			f.newcomer(t, 0)
			if f.rejected() == 0 {
				t.Error("no status counted as rejected")
			}
			f.quietLogs(t, "version not the signed one", "replayed under another version", "unsigned", "ahead of Redis's clock")
		})
	}
}

// Fifty members added with scores a year ahead, and a node's lease set
// without a TTL, do not keep a stopped backend in any view: every
// heartbeat drops such members, and the lease's owner takes a lease
// without TTL over at its next round. Then fifty members kept within the
// bounds (rewritten every 50 ms) are ignored with the secret (unsigned),
// and without it only move the keys they would own to every instance's
// own probes, as no status of theirs ever covers them: the other stopped
// backends leave every view within the bound too. ReadFleet never lists a
// forged member as live.
func TestAttackFakeMembersAndLease(t *testing.T) {
	for _, tc := range []struct {
		name   string
		secret []byte
	}{{"secret", attackSecret}, {"no secret", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			f := startAttackFleet(t, 3, 4, tc.secret)
			ctx := context.Background()
			now, err := f.raw.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			var far []redis.Z
			for i := range 50 {
				far = append(far, redis.Z{Score: float64(now.Add(365 * 24 * time.Hour).UnixMilli()), Member: fmt.Sprintf("far%02d", i)})
			}
			if err := f.raw.ZAdd(ctx, membersKey("fleet:"), far...).Err(); err != nil {
				t.Fatal(err)
			}
			if err := f.raw.Set(ctx, leaseKey("fleet:", f.targets[0].Key), "fakeholder", 0).Err(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			eventually(t, 5*time.Second, "the far-future members dropped, the lease taken by a live member", func() bool {
				n, err := f.raw.ZCount(ctx, membersKey("fleet:"), strconv.FormatInt(now.Add(time.Hour).UnixMilli(), 10), "+inf").Result()
				if err != nil {
					t.Fatal(err)
				}
				holder := f.raw.Get(ctx, leaseKey("fleet:", f.targets[0].Key)).Val()
				for _, in := range f.ins {
					if in.coord.Token() == holder {
						return n == 0
					}
				}
				return false
			})
			t.Logf("far-future members dropped and the lease without TTL taken over %v after the writes", time.Since(start).Round(time.Millisecond))
			took := f.leaves(t, 0)
			t.Logf("backend 0 stopped after the writes: gone from every view in %v (bound %v)", took.Round(time.Millisecond), attackBound)

			// Members kept within the bounds, rewritten every 50 ms.
			actx, stop := context.WithCancel(ctx)
			var wg sync.WaitGroup
			wg.Go(func() {
				for actx.Err() == nil {
					var near []redis.Z
					until := float64(time.Now().Add(800 * time.Millisecond).UnixMilli())
					for i := range 50 {
						near = append(near, redis.Z{Score: until, Member: fmt.Sprintf("near%02d", i)})
					}
					f.raw.ZAdd(actx, membersKey("fleet:"), near...)
					time.Sleep(50 * time.Millisecond)
				}
			})
			t.Cleanup(func() { stop(); wg.Wait() })
			eventually(t, 5*time.Second, "the members kept within the bounds are in Redis", func() bool {
				return f.raw.ZScore(ctx, membersKey("fleet:"), "near00").Err() == nil
			})
			for i := 1; i < len(f.targets); i++ {
				took := f.leaves(t, i)
				t.Logf("backend %d stopped while members are forged: gone from every view in %v (bound %v)", i, took.Round(time.Millisecond), attackBound)
			}
			f.newcomer(t, 0)

			fl, err := ReadFleet(ctx, f.raw, fleetConfig("fleet:", tc.secret), nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range fl.Members {
				if strings.HasPrefix(m.Token, "far") || tc.secret != nil && strings.HasPrefix(m.Token, "near") {
					t.Errorf("ReadFleet lists the forged member %s as live", m.Token)
				}
			}
			if tc.secret != nil && len(fl.Members) != len(f.ins) {
				t.Errorf("ReadFleet lists %d members, want the %d instances", len(fl.Members), len(f.ins))
			}
			if tc.secret != nil && len(fl.Refused) < 50 {
				t.Errorf("ReadFleet refused %d member entries, want the 50 unsigned ones at least", len(fl.Refused))
			}
			f.quietLogs(t, "ignored", "taken over")
		})
	}
}

// Garbage on the statuses channel (9,800 messages of every kind: not a
// message, wrongly signed, unsigned, ahead of Redis's clock, and three of
// 5 MB) and in the stored statuses (a status key that
// is not a hash, a status of 5 MB, a version that is not a number) is
// counted as rejected, logged at most once per kind, and kept by no
// instance: memory stays bounded, the fleet stays coordinated, and a
// stopped backend still leaves every view within the bound.
func TestAttackGarbageMessages(t *testing.T) {
	f := startAttackFleet(t, 2, 2, attackSecret)
	ctx := context.Background()
	before := heapInUse()
	big := strings.Repeat("x", 5<<20)
	key := f.targets[0].Key
	unsigned := encode("c/zz", status{V: 1, Addr: f.targets[0].Addr, Holder: "x", At: 1, State: "up"}, nil)
	kinds := []string{
		"garbage",
		`1 4 c/zzsig=zz {"v":1}`,
		"1 4 c/zz" + string(unsigned),
		fmt.Sprintf("%d %d %s%s", int64(math.MaxInt64), len(key), key, encode(key, status{V: math.MaxInt64, Addr: f.targets[0].Addr, Holder: "x", At: 1, State: "up"}, attackSecret)),
	}
	const garbage = 9800
	pipe := f.raw.Pipeline()
	for i := range garbage {
		pipe.Publish(ctx, channel("fleet:"), kinds[i%len(kinds)])
		if i%500 == 499 {
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := f.raw.Publish(ctx, channel("fleet:"), "1 4 c/n0"+big).Err(); err != nil {
			t.Fatal(err)
		}
	}
	want := garbage + 3
	eventually(t, 30*time.Second, fmt.Sprintf("every garbage message (%d) counted as rejected by every instance", want), func() bool {
		for i, o := range f.obs {
			if n := o.count("rejected"); n < want {
				t.Logf("instance %d: %d rejected, %d stale so far", i, n, o.count("stale"))
				return false
			}
		}
		return true
	})
	// Stored garbage, read by the resyncs (every second here).
	if err := f.raw.Set(ctx, statusKey("fleet:", "c/string"), "not a hash", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.raw.HSet(ctx, statusKey("fleet:", "c/big"), "v", "1", "s", big).Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.raw.HSet(ctx, statusKey("fleet:", "c/nan"), "v", "nan", "s", "x").Err(); err != nil {
		t.Fatal(err)
	}
	counted := f.rejected()
	eventually(t, 10*time.Second, "the stored garbage counted as rejected by the resyncs", func() bool { return f.rejected() >= counted+3*len(f.ins) })
	after := heapInUse()
	for i, in := range f.ins {
		if m := in.coord.Mode(); m != ModeCoordinated {
			t.Errorf("instance %d in mode %s after the garbage, want coordinated", i, m)
		}
		lines := 0
		for _, l := range f.logs[i].lines {
			if strings.Contains(l, "dropped") {
				lines++
			}
		}
		t.Logf("instance %d: %d rejected, %d log lines about them", i, f.obs[i].count("rejected"), lines)
		if lines > 5 {
			t.Errorf("instance %d wrote %d lines for %d rejected statuses of 5 kinds, want one per kind", i, lines, f.obs[i].count("rejected"))
		}
	}
	f.quietLogs(t, "malformed", "too large", "unsigned", "wrongly signed", "ahead")
	t.Logf("heap in use %d MiB before the garbage, %d MiB after (three 5 MB messages read by %d instances)", before>>20, after>>20, len(f.ins))
	if after > before+32<<20 {
		t.Errorf("heap in use grew from %d to %d MiB: garbage is kept", before>>20, after>>20)
	}
	took := f.leaves(t, 0)
	t.Logf("backend stopped after the garbage: gone from every view in %v (bound %v)", took.Round(time.Millisecond), attackBound)
}

func heapInUse() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// Keys of another type than the scripts write (a lease that is a hash, a
// status that is a string, a members set that is a string) are treated as
// absent and rewritten: the fleet never drops to local mode for them, and
// the views still follow the backends.
func TestAttackWrongTypes(t *testing.T) {
	f := startAttackFleet(t, 2, 2, nil)
	ctx := context.Background()
	if err := f.raw.Del(ctx, leaseKey("fleet:", f.targets[0].Key)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.raw.HSet(ctx, leaseKey("fleet:", f.targets[0].Key), "x", "y").Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.raw.Set(ctx, statusKey("fleet:", f.targets[1].Key), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := f.raw.Set(ctx, membersKey("fleet:"), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "both keys written again by their holders, both members back", func() bool {
		fl, err := ReadFleet(ctx, f.raw, fleetConfig("fleet:", nil), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tg := range f.targets {
			if k := fl.Keys[tg.Key]; k.Holder == "" || k.Status == nil || k.Stale != "" {
				return false
			}
		}
		return len(fl.Members) == len(f.ins)
	})
	for i := range f.targets {
		took := f.leaves(t, i)
		t.Logf("backend %d stopped: gone from every view in %v", i, took.Round(time.Millisecond))
	}
	for i, l := range f.logs {
		if n := l.count("does not answer"); n > 0 {
			t.Errorf("instance %d went to local mode %d times for keys of another type", i, n)
		}
	}
}

// A node's lease rewritten every 50 ms with the token of a live member
// that is not the node's owner (so that no vetting of the holder finds it
// void) keeps the owner from writing only for a lease at a time: the owner
// takes it back once it has been kept from it for a lease, and its next
// status, the stopped backend down, reaches every view within the bound.
func TestAttackLeaseOfLiveMember(t *testing.T) {
	f := startAttackFleet(t, 3, 1, attackSecret)
	ctx := context.Background()
	key := f.targets[0].Key
	var owner, other *instance
	for _, in := range f.ins {
		if len(in.coord.Held()) == 1 {
			owner = in
		} else if other == nil {
			other = in
		}
	}
	actx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for actx.Err() == nil {
			f.raw.Set(actx, leaseKey("fleet:", key), other.coord.Token(), time.Second)
			time.Sleep(50 * time.Millisecond)
		}
	})
	t.Cleanup(func() { stop(); wg.Wait() })
	eventually(t, 5*time.Second, "the owner lost its lease to the rewrites", func() bool { return len(owner.coord.Held()) == 0 })
	took := f.leaves(t, 0)
	t.Logf("backend stopped while its lease is rewritten with another member's token: gone from every view in %v (bound %v)", took.Round(time.Millisecond), attackBound)
	f.newcomer(t, 0)
	f.quietLogs(t, "kept from this instance", "lost to another instance")
}
