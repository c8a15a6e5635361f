package lock

import (
	"context"
	"time"
)

// outageAfter is how long Redis calls must keep failing before this
// instance leaves the fleet for local mode: two cycles (one interval), so
// that a Redis that misses one deadline (a stall under load, a fail-over)
// does not make every instance of a fleet probe every target at once,
// which on a loaded machine starves the next Redis calls, and so on.
func (b bounds) outageAfter() time.Duration { return 2 * b.cycle }

// lost handles a Redis call of tend, begun at start, that failed.
func (c *Coordinator) lost(ctx context.Context, start time.Time, err error) {
	if ctx.Err() != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failed(start, err)
}

// failed counts a Redis call, begun at start, that failed with err: the
// failure streak begins with the first such call since the last heartbeat
// that answered, and local mode once the streak spans outageAfter (at
// once for an instance that has never coordinated: it has no fleet to
// leave). Until then this instance keeps its leases and probes what it
// holds, and the others' statuses keep covering the rest: nothing it
// answers waits on Redis either way. c.mu is held.
func (c *Coordinator) failed(start time.Time, err error) {
	if c.mode == ModeLocal {
		return
	}
	if c.failingSince.IsZero() || start.Before(c.failingSince) {
		c.failingSince = start
	}
	if c.mode != ModeCoordinated || time.Since(c.failingSince) >= c.b.outageAfter() {
		c.goLocal(err)
		return
	}
	c.rlog.Logf("redis failed", "a Redis call failed (%v): still coordinating, local mode if Redis calls keep failing for %v", err, c.b.outageAfter())
}

// goLocal switches to local mode: every target is probed here from now on,
// continuing from the last statuses known. No target is probed at once:
// those this instance held are probed at their ticks as before, and each
// of the others at its own tick (the checker spreads them over an
// interval), so that a fleet that loses Redis raises its probe rate over
// an interval rather than in one burst. c.mu is held.
func (c *Coordinator) goLocal(err error) {
	if c.mode == ModeLocal {
		return
	}
	c.mode = ModeLocal
	c.failingSince = time.Time{}
	c.logf("Redis does not answer (%v): checking every backend locally until it does", err)
	c.observe(func(o Observer) { o.Mode(ModeLocal) })
	clear(c.held)
	c.observeLeases()
	c.signal()
}
