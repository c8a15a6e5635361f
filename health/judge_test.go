package health

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestTrackerRiseFall(t *testing.T) {
	ok := func(role string, wal uint64) result { return result{cause: CauseOK, role: role, wal: wal} }
	bad := func(cause string) result { return result{cause: cause, detail: cause + " detail"} }
	steps := []struct {
		r        result
		state    State
		role     string
		cause    string
		changed  bool
		walMoved bool
	}{
		{ok(RolePrimary, 10), Unknown, "", "", false, true}, // 1 of rise 2
		{bad(CauseRefused), Unknown, "", "", false, false},  // 1 of fall 3: the success count starts over
		{ok(RolePrimary, 10), Unknown, "", "", false, false},
		{ok(RolePrimary, 11), Up, RolePrimary, CauseOK, true, true},
		{ok(RolePrimary, 11), Up, RolePrimary, CauseOK, false, false},
		{ok(RoleStandby, 11), Up, RoleStandby, CauseOK, true, false}, // a role change while Up is published at once
		{bad(CauseTimeout), Up, RoleStandby, CauseOK, false, false},
		{bad(CauseTimeout), Up, RoleStandby, CauseOK, false, false},
		{bad(CauseTimeout), Down, RoleStandby, CauseTimeout, true, false},
		{bad(CauseTimeout), Down, RoleStandby, CauseTimeout, false, false},
		{bad(CauseRefused), Down, RoleStandby, CauseRefused, true, false}, // a new cause while Down is published
		{ok(RolePrimary, 12), Down, RoleStandby, CauseRefused, false, true},
		{ok(RolePrimary, 12), Up, RolePrimary, CauseOK, true, false},
	}
	tr := tracker{rise: 2, fall: 3}
	at := time.Unix(1700000000, 0)
	for i, s := range steps {
		at = at.Add(time.Second)
		changed, walMoved := tr.record(s.r, at)
		v := tr.v
		if v.State != s.state || v.Role != s.role || v.Cause != s.cause || changed != s.changed || walMoved != s.walMoved {
			t.Errorf("step %d (%+v): got %v/%q/%q changed=%v walMoved=%v, want %v/%q/%q changed=%v walMoved=%v",
				i, s.r, v.State, v.Role, v.Cause, changed, walMoved, s.state, s.role, s.cause, s.changed, s.walMoved)
		}
		if !v.Last.Equal(at) {
			t.Errorf("step %d: Last %v, want %v", i, v.Last, at)
		}
		if (v.State == Down) != (v.Detail != "") {
			t.Errorf("step %d: detail %q in state %v: want a detail exactly while Down", i, v.Detail, v.State)
		}
	}
}

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{Unknown: "unknown", Up: "up", Down: "down", State(9): "unknown"} {
		if got := s.String(); got != want {
			t.Errorf("State(%d).String() = %q, want %q", s, got, want)
		}
	}
}

func TestBound(t *testing.T) {
	if got := bound("short"); got != "short" {
		t.Errorf("bound(short) = %q", got)
	}
	long := strings.Repeat("é", 150) // 300 bytes
	got := bound(long)
	if len(got) > maxDetail || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") {
		t.Errorf("bound(300 bytes) = %d bytes %q: want at most %d, valid UTF-8, ending in ...", len(got), got, maxDetail)
	}
}
