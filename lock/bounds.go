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
	resync    time.Duration // how often every stored status is read again
	interval  time.Duration // of the checks
}

// bounds checks cfg and returns its bounds.
func (cfg Config) bounds() (bounds, error) {
	if cfg.Interval <= 0 || cfg.Timeout <= 0 {
		return bounds{}, fmt.Errorf("lock: the checks' interval %v and timeout %v must be positive", cfg.Interval, cfg.Timeout)
	}
	b := bounds{ttl: cfg.LeaseTTL, resync: cfg.Resync, interval: cfg.Interval, cycle: cfg.Interval / 2}
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

// cover is how old a status may be and still cover its key. A holder
// rewrites its status at every probe but publishes it only when it
// changes, so what a reader knows of it is at most a resync old: older
// than a resync, a lease and an interval, nobody writes it any more.
func (b bounds) cover() time.Duration { return b.resync + b.ttl + b.interval }

// stale says why a status written by holder with version (Redis's clock
// at the write, µs) does not cover its key at now (Redis's clock, µs), for
// the live members and the key's owner among them, or "" when it covers
// it: its writer must be the live member the fleet gives the key to
// (rendezvous over the live members: one the fleet moved the key away
// from no longer probes it, and a key given to a member that writes
// nothing, as one anyone added, must not be covered by the last status of
// its old holder), and it must be recent (see cover) and not ahead of the
// clock by more than a lease.
func (b bounds) stale(holder, keyOwner string, version int64, live map[string]bool, now int64) string {
	switch {
	case !live[holder]:
		return "its writer is not a live member of the fleet"
	case keyOwner != holder:
		return "its writer no longer holds the key: the fleet gives it to another member"
	case version < now-b.cover().Microseconds():
		age := time.Duration(now-version) * time.Microsecond
		return fmt.Sprintf("written %v ago, longer than %v (a resync, a lease and an interval)", age.Round(time.Millisecond), b.cover())
	case version > now+b.ttl.Microseconds():
		return fmt.Sprintf("its version is %v ahead of Redis's clock, more than a lease (%v)", aheadBy(version, now), b.ttl)
	}
	return ""
}
