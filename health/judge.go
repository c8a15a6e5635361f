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
			changed = true
		case t.v.State == Up && t.v.Role != r.role:
			t.v.Role = r.role
			changed = true
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
		changed = t.v.Cause != r.cause
		t.v.Cause, t.v.Detail = r.cause, r.detail
	}
	return changed, false
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
