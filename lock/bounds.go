package lock

import (
	"fmt"
	"time"
)

// bounds are the times a fleet's coordination is measured by, all made
// from a Config's check interval and timeout (and LeaseTTL and Resync when
// set), so that every instance and tool of a fleet with the same options
// vets what it reads from Redis by the same bounds.
type bounds struct {
	ttl       time.Duration // of a lease
	memberTTL time.Duration // of a membership
	cycle     time.Duration // how often leases and membership are looked after
	resync    time.Duration // how often every stored status is read again, at the least, as a safety net
	interval  time.Duration // of the checks
	timeout   time.Duration // of a probe
}

// bounds checks cfg and returns its bounds.
func (cfg Config) bounds() (bounds, error) {
	if cfg.Interval <= 0 || cfg.Timeout <= 0 {
		return bounds{}, fmt.Errorf("lock: the checks' interval %v and timeout %v must be positive", cfg.Interval, cfg.Timeout)
	}
	b := bounds{ttl: cfg.LeaseTTL, resync: cfg.Resync, interval: cfg.Interval, timeout: cfg.Timeout, cycle: cfg.Interval / 2}
	if b.ttl == 0 {
		b.ttl = max(3*cfg.Interval+cfg.Timeout, time.Second)
	}
	if b.ttl < 2*cfg.Interval {
		return bounds{}, fmt.Errorf("lock: lease TTL %v is under two check intervals (%v): a live holder would lose its lease between probes", b.ttl, 2*cfg.Interval)
	}
	if b.resync == 0 {
		b.resync = DefaultResync
	}
	// A member lapses a cycle before its leases can, so that the others
	// start probing its targets no later than its leases end.
	b.memberTTL = b.ttl - b.cycle
	return b, nil
}

// memberAhead is how far ahead of Redis's clock a membership may lapse
// and still count: a member TTL and a lease of slack (for an instance
// whose interval is longer while a fleet's options change). No instance
// writes one further ahead, and one that did would count for good.
func (b bounds) memberAhead() time.Duration { return b.memberTTL + b.ttl }

// legacyResync is how often an instance reads again the statuses of a
// holder that numbers none of its publishes (an instance of an earlier
// version, in a fleet being upgraded): what it knows of them is then at
// most that old, as when every instance read every status that often.
const legacyResync = 10 * time.Second

// cover is how long what this instance knows of a holder's status may go
// unconfirmed and still cover its key. A holder's statuses are confirmed
// at every heartbeat that finds nothing it published missing here (its
// watermark), and those of a holder that numbers nothing each time they
// are read again (every legacyResync): past a resync, a lease and an
// interval, their holder has stopped writing them.
func (b bounds) cover() time.Duration { return legacyResync + b.ttl + b.interval }

// rewriteEvery is how many intervals a holder's stored status may go
// unwritten while its verdict does not change (see bounds.rewrite).
const rewriteEvery = 5

// rewrite is how often, at the least, a holder rewrites a stored status
// whose verdict has not changed: what changes is written and published at
// once, and what the others know of a quiet status is kept current by its
// holder's watermark (see cover), not by its version, so that rewriting
// it at every probe would cost Redis a write per target per interval for
// nothing. The rewrites are what keep a stored status younger than
// storedAge (a status older is no holder's: an old one stored again), and
// what repair, within this period, a status anyone overwrote without
// publishing (see WriteOptions.Expect). The lease is extended between
// them (see Leases.ExtendAll).
func (b bounds) rewrite() time.Duration { return rewriteEvery * b.interval }

// extendAfter is how old a lease's last extension may be before the next
// round of tend extends it (see Coordinator.extend): half a lease, so that
// a lease extended at a round is extended again at the round after it
// reaches that age, with a lease's other half, less a cycle, for the call.
func (b bounds) extendAfter() time.Duration { return b.ttl / 2 }

// storedAge is how old a stored status read from Redis may be and count
// as its holder's current one: a holder rewrites its status at least every
// rewrite period, at its next probe, so that period, an interval, a probe,
// a cycle and the longest a Redis call may take. An older one is no
// holder's any more (an old genuine status stored again, perhaps),
// whatever a reader that knows nothing newer would think.
func (b bounds) storedAge() time.Duration {
	return b.rewrite() + b.interval + b.timeout + b.cycle + MaxCallTimeout
}

// stale says why a status written by holder with version (Redis's clock
// at the write, µs), and known current as of asOf (µs), does not cover
// its key at now (Redis's clock, µs), for the live members and the key's
// owner among them, or "" when it covers it: its writer must be a live
// member, the one the fleet gives the key to (rendezvous over the live
// members), or one that still hands the key over to it and wrote this
// status within a handover (see handover); it must have been known current
// within fresh, and it must not be ahead of the clock by more than a
// lease.
func (b bounds) stale(holder, keyOwner string, version, asOf int64, live map[string]bool, now int64, fresh time.Duration) string {
	switch {
	case !live[holder]:
		return "its writer is not a live member of the fleet"
	case keyOwner != holder && version < now-b.handover().Microseconds():
		age := time.Duration(now-version) * time.Microsecond
		return fmt.Sprintf("its writer no longer holds the key (the fleet gives it to another member) and wrote it %v ago, longer than a handover (%v)", age.Round(time.Millisecond), b.handover())
	case asOf < now-fresh.Microseconds() && asOf == version:
		age := time.Duration(now-version) * time.Microsecond
		return fmt.Sprintf("written %v ago, longer than %v", age.Round(time.Millisecond), fresh)
	case asOf < now-fresh.Microseconds():
		age := time.Duration(now-asOf) * time.Microsecond
		return fmt.Sprintf("its writer's publishes last confirmed %v ago, longer than %v", age.Round(time.Millisecond), fresh)
	case version > now+b.ttl.Microseconds():
		return fmt.Sprintf("its version is %v ahead of Redis's clock, more than a lease (%v)", aheadBy(version, now), b.ttl)
	}
	return ""
}

// handover is how long the status of a holder the fleet moved its key
// away from covers the key after it was written. Such a holder keeps the
// lease and goes on probing the key, writing and publishing each verdict,
// until the new owner takes the lease over from it (see
// Coordinator.plan): a key moves to a member that joins only once that
// member can probe it, and the others probe nothing meanwhile, however
// long the new member takes to start. A holder that stopped (its lease
// taken, or it stopped probing) writes nothing more, and its last status
// stops covering the key a handover later: an interval, a probe and a
// cycle, the most between two writes of a holder that probes. (A key
// given to a member that writes nothing, as one anyone added, so stays
// with its holder rather than being covered by its last status for
// long.)
func (b bounds) handover() time.Duration { return b.interval + b.timeout + b.cycle }

// safetyEvery is how often an instance of a fleet of members reads every
// stored status again as a safety net: every resync, and in a large fleet
// every two intervals per member, so that the fleet's safety reads of M
// statuses stay under half its M status writes per interval.
func (b bounds) safetyEvery(members int) time.Duration {
	return max(b.resync, 2*time.Duration(members)*b.interval)
}

// rejoinStep is the most time between two heartbeats in local mode.
const rejoinStep = 250 * time.Millisecond

// step is how often an instance in local mode asks whether Redis is back:
// a cycle divided into equal parts of at most rejoinStep, so that a
// coordinating instance's cycle stays whole steps.
func (b bounds) step() time.Duration {
	parts := (b.cycle + rejoinStep - 1) / rejoinStep
	return b.cycle / max(parts, 1)
}
