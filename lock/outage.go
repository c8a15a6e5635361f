package lock

import (
	"context"
	"errors"
	"net"
	"time"
)

// outageAfter is how long Redis calls must keep failing before this
// instance leaves the fleet for local mode: two cycles (one interval),
// counted from the first failure of a streak (see failed), so that a
// Redis that misses one deadline (a stall under load, a fail-over) does
// not make every instance of a fleet probe every target at once, which on
// a loaded machine starves the next Redis calls, and so on.
func (b bounds) outageAfter() time.Duration { return 2 * b.cycle }

// callTimeout is the longest deadline of a Coordinator's Redis call (see
// latency): the outage window, within [CallTimeout, MaxCallTimeout]. A
// Redis that answers slowly (starved of CPU, say 40 instances started
// together on 2 cores) is given that long: with half the window, calls
// that Redis answered in 1 to 2 s failed, every instance went local, and
// their probes kept the machine saturated; with the whole window the same
// fleet settled within 30 to 40 s. A frozen Redis is still noticed
// within four cycles and a call's deadline: the first failed call ends
// within a deadline (two cycles at most), and the next, sent within a
// cycle, within another. The deadline grows only after slow calls (see
// latency): a Redis that answered quickly is judged by 500 ms ones.
func (b bounds) callTimeout() time.Duration {
	return min(max(b.outageAfter(), CallTimeout), MaxCallTimeout)
}

// lost handles a Redis call of tend, begun at start, that failed.
func (c *Coordinator) lost(ctx context.Context, start time.Time, err error) {
	if ctx.Err() != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failed(start, err)
}

// answered notes that Redis answered a call of this instance: a streak
// of failures ends. c.mu is held.
func (c *Coordinator) answered() {
	c.answeredAt = time.Now()
	c.failingSince, c.cause = time.Time{}, nil
}

// failed counts a Redis call, begun at start, that failed with err. One
// call, however slow, is never an outage: a call sent before Redis last
// answered another says only that it was slow; the failure streak begins
// when the first call sent since failed, and local mode once a call sent
// after that failure has failed too, outageAfter or more after it (Redis
// has then answered nothing for at least outageAfter and a deadline). So it
// goes for an instance joining the fleet (see join) as for one
// coordinating. Until then this instance keeps its leases and probes what
// it holds, and the others' statuses keep covering the rest (a joining
// instance probes nothing yet): nothing it answers waits on Redis either
// way. c.mu is held.
func (c *Coordinator) failed(start time.Time, err error) {
	c.noteCause(err)
	if c.mode == ModeLocal {
		if !c.causeTold && !deadline(c.cause) {
			// Local mode began on a deadline: say now what is wrong.
			c.causeTold = true
			if c.cfg.Passive {
				c.modef("Redis does not answer (%v): still answering the statuses last read", c.cause)
			} else {
				c.modef("Redis does not answer (%v): still checking every backend locally", c.cause)
			}
		}
		return
	}
	if deadline(err) && !c.answeredAt.IsZero() && time.Since(c.answeredAt) < c.b.ttl && c.leases.lat.lateSince(start) {
		// This process ran a call late since this one began, starved of
		// CPU: Redis may have answered this one in time, unseen. Taking
		// that for an outage would make this instance probe every
		// target, loading the machine that starves it further (40
		// instances started together on 2 cores went local over and
		// over, and never settled). Its leases and the statuses it reads
		// stay bounded by their own times meanwhile. After a lease with
		// no answer at all, deadlines count whatever ran late.
		if !c.cfg.QuietModes {
			c.rlog.Logf("redis late", "a Redis call ran out of time while this process ran late (starved of CPU) (%v): not counted as Redis failing, still coordinating", err)
		}
		return
	}
	if c.returnOwners != nil && !start.Before(c.answeredAt) {
		// Redis fails again (a call sent since it last answered) while
		// the others' targets are left to them after a return: their
		// statuses may not come. Each is probed here again at its tick.
		c.returnOwners = nil
	}
	now := time.Now()
	switch {
	case start.Before(c.answeredAt):
		// Redis answered a call sent after this one.
	case c.failingSince.IsZero():
		c.failingSince = now
	case !start.Before(c.failingSince) && now.Sub(c.failingSince) >= c.b.outageAfter():
		c.goLocal()
		return
	}
	if c.cfg.QuietModes {
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

// localCover is how long after its holder was last confirmed a status
// covers its key in local mode (see goLocal): a lease less an interval,
// so that a node that stops as Redis does leaves the answers within
// fall × interval + timeout + a lease (its first probe here comes within
// an interval of the cover's end), the bound of a node whose holder dies
// with it while Redis answers (its membership lapses, a cycle passes
// before the next heartbeat sees it, and the new owner probes at once).
func (b bounds) localCover() time.Duration { return b.ttl - b.interval }

// goLocal switches to local mode: every target is probed here from now on,
// continuing from the last statuses known, but none at once and not all
// from the start. Those this instance held are probed at their ticks as
// before. A target another holder's status covers as Redis stops
// answering is left to that status (in the View too) for as long as the
// fleet's bounds allow (see bounds.localCover). Each of the
// others, and each of these once its status lapses, is probed at its own
// tick (the checker spreads them over an interval). So a fleet that loses
// Redis raises its probe rate over an interval, and one whose instances
// miss Redis's deadlines for a few seconds (a Redis starved of CPU by the
// fleet it serves, say) probes little more than before: were every instance
// to probe every target at once, their probes would starve Redis further,
// and the next instances' calls, until the whole fleet probes everything.
// The line logged names the failure streak's cause (see noteCause). c.mu
// is held.
func (c *Coordinator) goLocal() {
	if c.mode == ModeLocal {
		return
	}
	c.localCover = make(map[string]localCover)
	for k, addr := range c.targets {
		if c.held[k] || !c.covered(k, addr) {
			continue
		}
		r := c.remote[k]
		asOf, _ := c.asOf(r)
		if until := asOf + c.b.localCover().Microseconds(); until > c.now() {
			c.localCover[k] = localCover{addr: addr, until: until}
			delete(c.own, k) // older than the holder's status, which the View answers
			c.touch(k)
		}
	}
	c.mode = ModeLocal
	c.localAt = c.now()
	c.forgetCovers()
	c.failingSince = time.Time{}
	c.causeTold = !deadline(c.cause)
	if c.cfg.Passive {
		c.modef("Redis does not answer (%v): answering the statuses last read until it does (a passive instance probes nothing)", c.cause)
	} else if len(c.localCover) > 0 {
		c.modef("Redis does not answer (%v): checking every backend locally until it does, the %d that other holders' statuses cover once those lapse (within %v)",
			c.cause, len(c.localCover), c.b.localCover())
	} else {
		c.modef("Redis does not answer (%v): checking every backend locally until it does", c.cause)
	}
	c.observe(func(o Observer) { o.Mode(ModeLocal) })
	clear(c.held)
	c.observeLeases()
	c.signal()
}
