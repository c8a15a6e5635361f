package lock

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// counter is an Observer that counts messages by result.
type counter struct {
	mu       sync.Mutex
	messages map[string]int
}

func (c *counter) Mode(string)               {}
func (c *counter) Leases(int)                {}
func (c *counter) Resync(error)              {}
func (c *counter) Propagation(time.Duration) {}
func (c *counter) Extend(int, int)           {}
func (c *counter) Write(bool, bool)          {}
func (c *counter) Message(result string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.messages[result]++
}

func (c *counter) count(result string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.messages[result]
}

// With redis_secret, statuses are signed: a status published or stored by
// someone without the secret (unsigned, signed with another key, a
// signature that is not hex, a signed status replayed under another key) is
// dropped and counted as rejected, its version does not count, so the
// holder's next status (a flip) still reaches the other instance. A
// genuine status replayed is stale, with its own version or another.
func TestCoordinatorSecret(t *testing.T) {
	srv, secret, b, _, obs, ins := startSignedPair(t)
	rx := 0 // the instance that receives the holder's statuses
	if len(ins[0].coord.Held()) == 1 {
		rx = 1
	}

	raw := srv.Client(t)
	ctx := context.Background()
	down := status{Addr: b.addr, Holder: "forger", At: time.Now().UnixMicro(), State: "down", Cause: "refused", Fail: 1}
	huge := time.Now().UnixMicro() * 4 // far above any real version
	forged := [][]byte{
		encode("c/a", down, nil),                          // unsigned
		encode("c/a", down, []byte("another-secret-16b")), // another key
		[]byte("sig=zz " + string(encode("c/a", down, nil))),
		encode("c/b", down, secret), // signed for another key, replayed on c/a
	}
	for _, body := range forged {
		msg := fmt.Sprintf("%d %d %s%s", huge, len("c/a"), "c/a", body)
		if err := raw.Publish(ctx, channel("fleet:"), msg).Err(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "four forged messages rejected", func() bool { return obs[rx].count("rejected") >= 4 })
	// Stored instead, and read by a resync: rejected too. The holder
	// rewrites its status at every probe, which may come between the
	// forgery and the read: it is stored again until one is read.
	for i, body := range forged[:2] {
		want := obs[rx].count("rejected") + 1
		eventually(t, 5*time.Second, "a forged stored status rejected", func() bool {
			if obs[rx].count("rejected") >= want {
				return true
			}
			if err := raw.HSet(ctx, statusKey("fleet:", "c/a"), "v", fmt.Sprint(huge+int64(i)), "s", body).Err(); err != nil {
				t.Fatal(err)
			}
			ins[rx].coord.sub.Resync()
			return false
		})
	}
	if s := ins[rx].state("c/a"); s != health.Up {
		t.Fatalf("after forged statuses the receiver's view says %v, want up", s)
	}
	// The holder's real flip still gets through: the forged versions did
	// not count.
	b.ln.Close()
	eventually(t, 5*time.Second, "the receiver applies the holder's down verdict", func() bool { return ins[rx].state("c/a") == health.Down })

	// A signed "up" of an earlier holder, captured a minute ago, is
	// stale when replayed, with its own version or another (the version
	// is signed: its own is older than the one applied): the view stays
	// down.
	then := time.Now().Add(-time.Minute).UnixMicro()
	old := status{V: then, Addr: b.addr, Holder: "earlier", At: then, State: "up", Cause: "ok", OK: 1}
	stale, rejected := obs[rx].count("stale"), obs[rx].count("rejected")
	for _, v := range []int64{then, time.Now().UnixMicro()} {
		msg := fmt.Sprintf("%d %d %s%s", v, len("c/a"), "c/a", encode("c/a", old, secret))
		if err := raw.Publish(ctx, channel("fleet:"), msg).Err(); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "both replays counted stale", func() bool { return obs[rx].count("stale") >= stale+2 })
	if n := obs[rx].count("rejected"); n != rejected {
		t.Errorf("%d replays of a genuine status counted rejected, want stale", n-rejected)
	}
	if s := ins[rx].state("c/a"); s != health.Down {
		t.Fatalf("a replayed old status made the receiver's view %v, want down", s)
	}
}

// startSignedPair starts two instances signing with one secret, each
// counting what it hears, over one backend, and waits until one holds its
// lease and both see it up.
func startSignedPair(t *testing.T) (*redistest.Server, []byte, *backend, []health.Target, [2]*counter, []*instance) {
	t.Helper()
	srv := redistest.Start(t)
	secret := []byte("0123456789abcdef-fleet")
	b := newBackend(t)
	targets := []health.Target{{Key: "c/a", Addr: b.addr}}
	obs := [2]*counter{{messages: map[string]int{}}, {messages: map[string]int{}}}
	var ins []*instance
	for i := range 2 {
		ins = append(ins, startInstance(t, newClient(t, srv), targets, func(c *Config) {
			c.Secret, c.Observer, c.Resync = secret, obs[i], time.Hour
		}))
	}
	eventually(t, 10*time.Second, "one instance holds the lease, both see the backend up", func() bool {
		total, _ := totalHeld(ins)
		return total == 1 && allState(ins, targets, health.Up)()
	})
	return srv, secret, b, targets, obs, ins
}
