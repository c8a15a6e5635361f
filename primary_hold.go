package pgcluster

import (
	"maps"
	"time"
)

// The primary hold: when a cluster's one serving primary leaves by its
// check (the server shut down, crashed or refused: the session of
// role_interval sees it at once) while no other node is primary yet,
// primary.<cluster> keeps answering its address for up to holdFor, until
// another node is seen as primary. A client that connects gets a refusal
// and asks again; an answer with no address would instead be cached as
// negative by resolvers and pools (pgbouncer's dns_nxdomain_ttl, Java's
// negative cache) for longer than the switchover lasts. The TXT of
// primary.<cluster> says state=held meanwhile. The checks alone decide: a
// node the registry takes out, a stale one, or one seen again as a standby
// is never held.

// holds are the publisher's holds: which node each cluster's primary. holds
// and until when.
type holds struct {
	// last is, by cluster, the node last built as its one serving primary.
	last  map[string]string
	until map[string]time.Time
	timer *time.Timer
}

// nextHeld looks at the clusters s rebuilt and returns the holds s should
// have, and whether they differ from s.held: a hold starts when a cluster
// whose last primary was known has none serving (and is not in split
// brain), and ends when a primary serves again, when the build refused it,
// or at its time. pb.mu is held.
func (pb *publisher) nextHeld(s *snapshot, now time.Time) (map[string]string, bool) {
	hold := pb.set.holdFor()
	if hold <= 0 || !pb.set.checksOn() {
		return nil, false
	}
	h := &pb.holds
	if h.last == nil {
		h.last, h.until = map[string]string{}, map[string]time.Time{}
	}
	held, cloned := s.held, false // s.held is s's: written only once cloned
	set := func(name, node string) {
		if held[name] == node {
			return
		}
		if !cloned {
			held, cloned = maps.Clone(s.held), true
			if held == nil {
				held = map[string]string{}
			}
		}
		if node == "" {
			delete(held, name)
			delete(h.until, name)
		} else {
			held[name] = node
			h.until[name] = now.Add(hold)
		}
	}
	for _, name := range s.rebuilt {
		cb := s.clusters[name]
		switch {
		case cb == nil:
			delete(h.last, name)
			set(name, "")
		case len(cb.stat.primaries) == 1:
			h.last[name] = cb.stat.primaries[0]
			set(name, "")
		case len(cb.stat.primaries) > 1:
			delete(h.last, name)
			set(name, "")
		case held[name] != "":
			// Built with the hold and refused it: the node is back, or out
			// for another reason than its check.
			if cb.held == held[name] && cb.stat.held == "" {
				set(name, "")
			}
		case h.last[name] != "":
			set(name, h.last[name])
			delete(h.last, name) // one hold per primary that leaves
		}
	}
	for name, t := range h.until {
		if !now.Before(t) {
			set(name, "")
		}
	}
	pb.armHoldTimer(now)
	return held, !maps.Equal(held, s.held)
}

// armHoldTimer sets the timer to the end of the next hold. pb.mu is held.
func (pb *publisher) armHoldTimer(now time.Time) {
	h := &pb.holds
	var next time.Time
	for _, t := range h.until {
		if next.IsZero() || t.Before(next) {
			next = t
		}
	}
	if h.timer != nil {
		h.timer.Stop()
	}
	if next.IsZero() {
		return
	}
	h.timer = time.AfterFunc(next.Sub(now), pb.endHolds)
}

// endHolds builds again the clusters whose hold has ended.
func (pb *publisher) endHolds() {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	if pb.cur != nil {
		pb.change(change{})
	}
}
