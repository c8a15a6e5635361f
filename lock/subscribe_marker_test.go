package lock

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// slowMarkers is a go-redis hook that holds every PUBLISH of a
// subscriber's marker for hold (or until its deadline), as a Redis call
// waits on a loaded machine: for a pooled connection, for its reply. The
// subscription's own connection is not held.
type slowMarkers struct{ hold time.Duration }

func (slowMarkers) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h slowMarkers) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); cmd.Name() == "publish" && len(args) > 1 {
			if ch, _ := args[1].(string); strings.Contains(ch, "echo:") {
				t := time.NewTimer(h.hold)
				defer t.Stop()
				select {
				case <-t.C:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (slowMarkers) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A subscriber applies each published status as it arrives while its
// marker's PUBLISH waits on a slow Redis call: the check that the
// subscription still hears is a call of its own, and the messages queued
// behind it must not wait for it. A marker held for 1.5 s every check
// held every status published meanwhile for as long, and at 10,000
// targets an instance whose statuses arrive late takes them for lapsed
// and probes what another holds. The markers still come back.
func TestSubscribeHearsWhileMarkerSlow(t *testing.T) {
	s := redistest.Start(t)
	l := holder(t, s, "k")
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	rdb.AddHook(slowMarkers{hold: 1500 * time.Millisecond})
	sub, col := runSubscriber(t, rdb, time.Hour)
	waitApplied(t, col, entry{"k", publish(t, l, "k", "s0"), "s0"})

	// Statuses published every 100 ms for 4 s, through at least two held
	// markers: each one's wait until applied.
	var worst time.Duration
	status := []string{"up", "down"}
	for i := range 40 {
		st := status[i%2]
		at := time.Now()
		e := entry{"k", publish(t, l, "k", st), st}
		waitApplied(t, col, e)
		worst = max(worst, time.Since(at))
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the slowest of 40 statuses applied %v after its publish, markers held 1.5 s", worst.Round(time.Millisecond))
	// Generous for a loaded machine, well under a held marker.
	if worst > 750*time.Millisecond {
		t.Errorf("a status waited %v to be applied while the marker's PUBLISH was held 1.5 s: the messages wait for the marker", worst.Round(time.Millisecond))
	}
	if sub.CaughtUp().IsZero() {
		t.Errorf("no marker came back in 4 s: the subscription's check no longer works with a slow PUBLISH")
	}
	for _, err := range col.errors() {
		t.Errorf("reported: %v", err)
	}
}
