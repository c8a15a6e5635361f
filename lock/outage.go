package lock

import (
	"context"
	"errors"
	"net"
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
// that answered, and local mode once the streak spans outageAfter, for an
// instance joining the fleet (see join) as for one coordinating. Until
// then this instance keeps its leases and probes what it holds, and the
// others' statuses keep covering the rest (a joining instance probes
// nothing yet): nothing it answers waits on Redis either way. c.mu is
// held.
func (c *Coordinator) failed(start time.Time, err error) {
	c.noteCause(err)
	if c.mode == ModeLocal {
		if !c.causeTold && !deadline(c.cause) {
			// Local mode began on a deadline: say now what is wrong.
			c.causeTold = true
			if c.cfg.Passive {
				c.logf("Redis does not answer (%v): still answering the statuses last read", c.cause)
			} else {
				c.logf("Redis does not answer (%v): still checking every backend locally", c.cause)
			}
		}
		return
	}
	if c.failingSince.IsZero() || start.Before(c.failingSince) {
		c.failingSince = start
	}
	if time.Since(c.failingSince) >= c.b.outageAfter() {
		c.goLocal()
		return
	}
	// A cause found after deadlines has a line of its own.
	kind, doing := "redis failed", "still coordinating"
	if c.mode == "" {
		kind, doing = "redis failed joining", "joining the fleet"
	}
	if deadline(c.cause) {
		kind += " deadline"
	}
	c.rlog.Logf(kind, "a Redis call failed (%v): %s, local mode if Redis calls keep failing for %v", c.cause, doing, c.b.outageAfter())
}

// noteCause keeps, of the errors of a failure streak, the one that says
// what is wrong: the first that is not a deadline. A call that runs out of
// time says only that (a TLS handshake refused after a few retries may
// take longer than the first call's deadline), while a later one, given
// more time (see latency), names the cause: a certificate not trusted, a
// password refused, a port where nothing listens. c.mu is held.
func (c *Coordinator) noteCause(err error) {
	if c.cause == nil || deadline(c.cause) && !deadline(err) {
		c.cause = err
	}
}

// deadline reports whether err is a call running out of time, which names
// no cause.
func deadline(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// goLocal switches to local mode: every target is probed here from now on,
// continuing from the last statuses known. No target is probed at once:
// those this instance held are probed at their ticks as before, and each
// of the others at its own tick (the checker spreads them over an
// interval), so that a fleet that loses Redis raises its probe rate over
// an interval rather than in one burst. The line logged names the failure
// streak's cause (see noteCause). c.mu is held.
func (c *Coordinator) goLocal() {
	if c.mode == ModeLocal {
		return
	}
	c.mode = ModeLocal
	c.failingSince = time.Time{}
	c.causeTold = !deadline(c.cause)
	if c.cfg.Passive {
		c.logf("Redis does not answer (%v): answering the statuses last read until it does (a passive instance probes nothing)", c.cause)
	} else {
		c.logf("Redis does not answer (%v): checking every backend locally until it does", c.cause)
	}
	c.observe(func(o Observer) { o.Mode(ModeLocal) })
	clear(c.held)
	c.observeLeases()
	c.signal()
}
