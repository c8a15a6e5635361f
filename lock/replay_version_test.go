package lock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// The version of a status is signed with it: the holder's current status,
// signed and valid, republished by someone without the secret with a
// version far above any real one, is stale (its own version is the one
// applied) and does not hold back the holder's next statuses (which carry
// the real, lower versions): the receiver still follows the backend going
// down.
func TestCoordinatorReplayedVersion(t *testing.T) {
	srv, secret, b, _, obs, ins := startSignedPair(t)
	rx := 0
	if len(ins[0].coord.Held()) == 1 {
		rx = 1
	}
	raw := srv.Client(t)
	ctx := context.Background()
	// The status replayed is one the receiver has applied: the holder
	// rewrites its status at every probe but publishes only changes, so
	// the one stored may be newer than the receiver's, and a newer
	// status under a forged version is refused, not stale. A resync has
	// the receiver read the stored one, until one is read before the
	// holder's next probe rewrites it.
	var stored string
	applied := func() bool {
		s, err := raw.HGet(ctx, statusKey("fleet:", "c/a"), "s").Result()
		if err != nil {
			return false
		}
		st, err := decode("c/a", []byte(s), secret)
		if err != nil {
			return false
		}
		c := ins[rx].coord
		c.mu.Lock()
		var v int64
		if r := c.remote["c/a"]; r != nil {
			v = r.version
		}
		c.mu.Unlock()
		stored = s
		return st.V <= v
	}
	eventually(t, 5*time.Second, "a stored status the receiver has applied", func() bool {
		if applied() {
			return true
		}
		ins[rx].coord.sub.Resync()
		return false
	})
	before := obs[rx].count("stale")
	huge := time.Now().UnixMicro() * 4
	if err := raw.Publish(ctx, channel("fleet:"), fmt.Sprintf("%d %d %s%s", huge, len("c/a"), "c/a", stored)).Err(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the replay counted stale", func() bool { return obs[rx].count("stale") > before })
	b.ln.Close()
	eventually(t, 5*time.Second, "the receiver applies the holder's down verdict after the replay", func() bool { return ins[rx].state("c/a") == health.Down })
}
