package lock

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// A subscription made again misses what was published while it was
// being made: only a read of every status, begun after it, finds that.
// Here the holder's "down" of one key goes out while the other
// instance's subscription is cut, and that instance's read fails (SCAN
// refused). A later publish of the holder (another key's "down"), heard
// live, must not vouch for the lost one: nothing of the holder counts as
// confirmed while the read is missing, and the read is tried again until
// it completes, which brings the lost "down". (Read once inside the
// subscription's loop, a failed read was never tried again, and the
// holder's later publishes and heartbeats went on vouching for its old
// "up".)
func TestSubscriptionReadTriedUntilComplete(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	ctx := context.Background()
	var (
		backends []*backend
		targets  []health.Target
	)
	for i := range 8 {
		b := newBackend(t)
		backends = append(backends, b)
		targets = append(targets, health.Target{Key: fmt.Sprintf("c/%d", i), Addr: b.addr})
	}
	// Each instance's SCANs are refused while its refuse is on: a read
	// of every status that cannot complete (a loaded Redis missing its
	// deadlines), while every other call goes through.
	var (
		ins     [2]*instance
		gates   [2]*gate
		refuse  [2]atomic.Bool
		refused [2]atomic.Int64
	)
	for i := range 2 {
		gates[i] = &gate{}
		rdb := newClient(t, srv, func(o *redis.Options) {
			o.Dialer, o.ClientName = gates[i].dial, fmt.Sprintf("instance%d", i)
		})
		rdb.AddHook(failCalls{on: &refuse[i], only: "scan", failed: &refused[i]})
		cfg := Config{Prefix: "fleet:", Interval: gapInterval, Timeout: gapTimeout, Resync: time.Hour, Logf: t.Logf}
		hc := health.Config{Check: health.CheckTCP, Interval: gapInterval, Timeout: gapTimeout, Rise: 1, Fall: 1}
		ins[i] = startChecked(t, rdb, targets, cfg, hc)
	}
	tokens := []string{ins[0].coord.Token(), ins[1].coord.Token()}
	slices.Sort(tokens)
	// The holder is the member the fleet gives more keys to (at least
	// four of eight): two of them are needed.
	var mine [2][]int
	for i, tg := range targets {
		for j := range 2 {
			if owner(tokens, tg.Key) == ins[j].coord.Token() {
				mine[j] = append(mine[j], i)
			}
		}
	}
	tx, rx := 0, 1
	if len(mine[1]) > len(mine[0]) {
		tx, rx = 1, 0
	}
	k1, k2 := mine[tx][0], mine[tx][1]
	holder, c := ins[tx].coord.Token(), ins[rx].coord
	remoteState := func(k int) string {
		c.mu.Lock()
		defer c.mu.Unlock()
		if r := c.remote[targets[k].Key]; r != nil && r.Holder == holder {
			return r.State
		}
		return ""
	}
	eventually(t, 15*time.Second, "every lease held by its owner, every view up, the holder's statuses applied by the other instance", func() bool {
		total, _ := totalHeld(ins[:])
		return total == len(targets) && len(ins[tx].coord.Held()) == len(mine[tx]) &&
			allState(ins[:], targets, health.Up)() && remoteState(k1) == "up" && remoteState(k2) == "up"
	})

	// Cut the other instance's subscription, and keep it from
	// subscribing again until the holder's "down" has gone out.
	refuse[rx].Store(true)
	gates[rx].closed.Store(true)
	if err := admin.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE pubsub: %v", err)
	}
	subscribers := func() int64 {
		n, err := admin.PubSubNumSub(ctx, channel("fleet:")).Result()
		if err != nil {
			return -1
		}
		return n[channel("fleet:")]
	}
	eventually(t, 10*time.Second, "the holder subscribed again, the other instance not", func() bool { return subscribers() == 1 })
	confirmed := func() int64 {
		c.mu.Lock()
		defer c.mu.Unlock()
		if f := c.feeds[holder]; f != nil {
			return f.confirmed
		}
		return 0
	}
	backends[k1].ln.Close()
	eventually(t, 10*time.Second, "the holder sees its first backend down", func() bool { return ins[tx].state(targets[k1].Key) == health.Down })
	gates[rx].closed.Store(false)
	eventually(t, 10*time.Second, "the other instance subscribed again, its read refused", func() bool {
		return subscribers() == 2 && refused[rx].Load() > 0
	})
	// Until now its confirmations could rise: by heartbeats before the
	// "down" went out.
	before := confirmed()

	// A later publish of the same holder, heard live.
	backends[k2].ln.Close()
	eventually(t, 10*time.Second, "the holder's second down heard live by the other instance", func() bool { return remoteState(k2) == "down" })
	if s := remoteState(k1); s != "up" {
		t.Fatalf("the other instance has %q for the first backend before any read completed: the test shows nothing", s)
	}
	if after := confirmed(); after > before {
		t.Errorf("the holder's publishes confirmed %v later while the read that finds its lost one had not completed: its old \"up\" is vouched for", time.Duration(after-before)*time.Microsecond)
	}

	refuse[rx].Store(false)
	at := time.Now()
	bound := c.b.interval + 2*c.b.cycle + MaxCallTimeout
	eventually(t, bound+attackMargin, "the lost down read by the other instance", func() bool { return remoteState(k1) == "down" })
	took := time.Since(at)
	eventually(t, 5*time.Second, "the holder's publishes confirmed again", func() bool { return confirmed() > before })
	t.Logf("a status published while the subscription was made again, its read refused %d times: read %v after SCAN answered again (bound %v: an interval, two cycles and a call)",
		refused[rx].Load(), took.Round(time.Millisecond), bound)
}
