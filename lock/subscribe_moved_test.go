package lock

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// A subscription left on the old master after a fail-over is found deaf
// even while it still hears messages there. go-redis's failover client, at
// a Sentinel's +switch-master, closes its pooled connections to the old
// master and leaves its Pub/Sub connection there, where the instances not
// switched yet keep publishing for a while: the subscription is never
// silent, so silence alone (deafChecks) would not find it deaf, while every
// status published on the new master is lost to it until its next resync.
// Here a client whose dialer follows a master address does the same: its
// normal connections to the old server are killed (CLIENT KILL TYPE
// normal) as the address moves, its Pub/Sub connection is left there, and
// stale messages are published there every 50 ms. PUBLISH of the
// subscriber's marker on the new server counts no receiver: the
// subscriber subscribes again there within missedMarkers checks, and a
// status published on the new server is applied.
func TestSubscribeLeftOnOldMaster(t *testing.T) {
	old, next := redistest.Start(t), redistest.Start(t)
	ctx := context.Background()
	v1 := publish(t, holder(t, old, "k"), "k", "up")

	var master atomic.Pointer[string]
	from, to := old.Addr(), next.Addr()
	master.Store(&from)
	rdb := redis.NewClient(&redis.Options{Addr: old.Addr(), ContextTimeoutEnabled: true,
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, *master.Load())
		}})
	t.Cleanup(func() { _ = rdb.Close() })
	sub, col := runSubscriber(t, rdb, time.Hour)
	waitApplied(t, col, entry{"k", v1, "up"})
	// A marker came back: Redis counted this subscription as its receiver.
	eventually(t, 5*time.Second, "no marker of the subscriber came back", func() bool { return !sub.CaughtUp().IsZero() })

	// The master moves: the pooled connections follow, the Pub/Sub one
	// stays, and the old server keeps publishing (a stale status: heard,
	// dropped).
	master.Store(&to)
	moved := time.Now()
	if err := old.Client(t).ClientKillByFilter(ctx, "TYPE", "normal").Err(); err != nil {
		t.Fatalf("CLIENT KILL TYPE normal: %v", err)
	}
	noise := old.Client(t)
	stop := make(chan struct{})
	talked := make(chan struct{})
	go func() {
		defer close(talked)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = noise.Publish(ctx, channel("test:"), fmt.Sprintf("%d 1 kup", v1)).Err()
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-talked })

	v2 := publish(t, holder(t, next, "k"), "k", "down")
	if v2 <= v1 {
		t.Fatalf("the new server's version %d is not above the old one's %d: the test shows nothing", v2, v1)
	}
	waitApplied(t, col, entry{"k", v2, "down"})
	t.Logf("a status published on the new server applied %v after the master moved", time.Since(moved).Round(time.Millisecond))
	var told bool
	for _, err := range col.errors() {
		told = told || strings.Contains(err.Error(), "no receiver")
	}
	if !told {
		t.Errorf("errors reported %v, want one saying the markers had no receiver", col.errors())
	}
}
