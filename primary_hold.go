package pgcluster

import (
	"maps"
	"slices"
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

// The hand-over: the other side of the same moment. When a standby is
// promoted while the old primary's session has not ended yet, both claim
// to be primary for an instant (a poll apart for one instance, a few
// milliseconds through Redis, longer on a loaded machine), and split brain
// would close primary. — an answer with no address in the middle of a
// clean switchover. So when the cluster's last one primary is among
// several claimants of one system and another is on a newer timeline (a
// promotion made it), primary. answers the promoted one for up to
// handoverFor (role_interval + timeout: by then the old primary's session
// has ended or its poll failed). If the old primary still claims the role
// after that, it is a split brain and primary. closes. Written to the
// promoted server, which is where the writes of record go from its
// promotion on, never to the old one.

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
	hold, handover := pb.set.holdFor(), pb.set.handoverFor()
	if hold <= 0 && handover <= 0 || !pb.set.checksOn() {
		return nil, false
	}
	h := &pb.holds
	if h.last == nil {
		h.last, h.until = map[string]string{}, map[string]time.Time{}
	}
	held, cloned := s.held, false // s.held is s's: written only once cloned
	set := func(name, node string, d time.Duration) {
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
			h.until[name] = now.Add(d)
		}
	}
	for _, name := range s.rebuilt {
		cb := s.clusters[name]
		switch {
		case cb == nil:
			delete(h.last, name)
			set(name, "", 0)
		case cb.stat.handedTo != "":
			// Handed over, the old primary not gone yet: until the end.
		case len(cb.stat.primaries) == 1:
			h.last[name] = cb.stat.primaries[0]
			set(name, "", 0)
		case len(cb.stat.primaries) > 1:
			last := h.last[name]
			delete(h.last, name) // one hand-over per primary replaced
			if handover > 0 && cb.stat.promoted != "" && cb.stat.promoted != last && slices.Contains(cb.stat.primaries, last) {
				set(name, cb.stat.promoted, handover)
			} else {
				set(name, "", 0)
			}
		case held[name] != "":
			// Built with the hold and refused it: the node is back, or out
			// for another reason than its check.
			if cb.held == held[name] && cb.stat.held == "" {
				set(name, "", 0)
			}
		case h.last[name] != "" && hold > 0:
			set(name, h.last[name], hold)
			delete(h.last, name) // one hold per primary that leaves
		}
	}
	for name, t := range h.until {
		if !now.Before(t) {
			set(name, "", 0)
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
