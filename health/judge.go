package health

import (
	"time"
	"unicode/utf8"
)

// result is what one probe found.
type result struct {
	cause  string // CauseOK on success
	detail string // the error text on failure
	role   string // postgres: RolePrimary or RoleStandby
	wal    uint64 // postgres: the LSN read, 0 when NULL
	tl     uint32 // postgres: a primary's timeline, 0 when unknown
	sysID  uint64 // postgres: the system identifier, 0 when unknown
	// postgres, on a primary: its standbys as it sees them (see
	// Verdict.Replicas), or replHidden.
	repl       []Replica
	replHidden bool
}

// failure makes the result of a failed probe, its detail bounded.
func failure(cause string, err error) result {
	return result{cause: cause, detail: bound(err.Error())}
}

// bound cuts s to at most maxDetail bytes, on a rune boundary.
func bound(s string) string {
	if len(s) <= maxDetail {
		return s
	}
	const ellipsis = "..."
	cut := maxDetail - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

// tracker applies rise and fall to one target's probe results. It belongs to
// the target's goroutine. Its counters stop at rise and fall: only reaching
// them matters, and bounded counters make a Progress that changes only when
// the judgement can.
type tracker struct {
	rise, fall int
	v          Verdict
	ok, fail   int // consecutive successes, failures
}

// record judges one result, probed at time at. It reports whether the verdict
// changed in a way the owner must hear of at once (state, role while Up, or
// cause while Down) and whether the WAL position moved.
func (t *tracker) record(r result, at time.Time) (changed, walMoved bool) {
	t.v.Last = at
	if t.v.Leaving {
		t.v.Leaving, changed = false, true
	}
	if r.cause == CauseOK {
		t.ok = min(t.ok+1, t.rise)
		t.fail = 0
		if r.wal != t.v.WAL {
			t.v.WAL = r.wal
			walMoved = true
		}
		switch {
		case t.v.State != Up && t.ok >= t.rise:
			t.v.State, t.v.Role, t.v.Cause, t.v.Detail = Up, r.role, CauseOK, ""
			t.v.Timeline, t.v.SystemID = r.tl, r.sysID
			t.v.Replicas, t.v.ReplicasHidden = r.repl, r.replHidden
			changed = true
		case t.v.State == Up:
			changed = t.identity(r) || changed
			// Which standbys are synchronous is a verdict change; how far
			// each has replayed moves as WAL positions do.
			if !SameReplicas(t.v.Replicas, r.repl, false) || t.v.ReplicasHidden != r.replHidden {
				changed = true
			} else if !SameReplicas(t.v.Replicas, r.repl, true) {
				walMoved = true
			}
			t.v.Replicas, t.v.ReplicasHidden = r.repl, r.replHidden
		}
		return changed, walMoved
	}
	t.fail = min(t.fail+1, t.fall)
	t.ok = 0
	switch {
	case t.v.State != Down && t.fail >= t.fall:
		t.v.State, t.v.Cause, t.v.Detail = Down, r.cause, r.detail
		changed = true
	case t.v.State == Down:
		changed = changed || t.v.Cause != r.cause
		t.v.Cause, t.v.Detail = r.cause, r.detail
	}
	return changed, false
}

// identity takes the role, timeline and system identifier of a successful
// probe or poll of a target that is Up, and reports whether they changed:
// a promotion, or another server behind the same address. A poll reads no
// system identifier (it cannot change under an open session): 0 keeps the
// one known.
func (t *tracker) identity(r result) bool {
	sysID := r.sysID
	if sysID == 0 {
		sysID = t.v.SystemID
	}
	if t.v.Role == r.role && t.v.Timeline == r.tl && t.v.SystemID == sysID {
		return false
	}
	t.v.Role, t.v.Timeline, t.v.SystemID = r.role, r.tl, sysID
	return true
}

// poll applies what a session's role poll read at time at: a change of
// role or timeline of a target that is Up counts at once, without rise (the
// server itself says so on a session that was already judged). A target
// not Up waits for its probes: a session says nothing of whether new
// connections are accepted.
func (t *tracker) poll(r result, at time.Time) (changed bool) {
	if t.v.State != Up || !t.identity(r) {
		return false
	}
	t.v.Last = at
	return true
}

// down takes the target Down at once with the failure r, without waiting
// for fall failed probes: the server said it is going (it shut down, or
// refused the connect that followed a session it ended). It reports whether
// the verdict changed.
func (t *tracker) down(r result, at time.Time) (changed bool) {
	t.v.Last = at
	t.ok, t.fail = 0, t.fall
	changed = t.v.State != Down || t.v.Cause != r.cause || t.v.Leaving
	t.v.Leaving = false
	t.v.State, t.v.Cause, t.v.Detail = Down, r.cause, r.detail
	return changed
}

// leaving marks an Up target whose session the server ended, until the
// probe that follows judges it. It reports whether that changed anything.
func (t *tracker) leaving() bool {
	if t.v.State != Up || t.v.Leaving {
		return false
	}
	t.v.Leaving = true
	return true
}

// progress returns the tracker's verdict and counters.
func (t *tracker) progress() Progress { return Progress{Verdict: t.v, OK: t.ok, Fail: t.fail} }

// load continues from p (another checker's progress), its counters bounded
// by this tracker's rise and fall.
func (t *tracker) load(p Progress) {
	t.v = p.Verdict
	t.ok = min(max(p.OK, 0), t.rise)
	t.fail = min(max(p.Fail, 0), t.fall)
}

// isZero reports whether p carries nothing to continue from.
func (p Progress) isZero() bool { return p.Verdict.State == Unknown && p.OK == 0 && p.Fail == 0 }
