package pgcluster

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// switchoverSettings are a postgres check's settings for the tests of this
// file.
func switchoverSettings() *settings {
	return &settings{zones: []string{testZone}, ttl: 1, allowLoopback: true, check: checkPostgres,
		interval: 2 * time.Second, timeout: time.Second, rise: 2, fall: 2, allDown: allDownClosed,
		splitBrain: splitBrainClosed, primaryHold: -1}
}

func switchoverNodes() []Node {
	return []Node{node("local", "pg1", "127.0.0.11", "primary"), node("local", "pg2", "127.0.0.12", "standby"),
		node("local", "pg3", "127.0.0.13", "standby")}
}

func upAs(role string, tl uint32, sys uint64) health.Verdict {
	return health.Verdict{State: health.Up, Role: role, Cause: health.CauseOK, Timeline: tl, SystemID: sys}
}

func downAs(role, cause string, tl uint32, sys uint64) health.Verdict {
	return health.Verdict{State: health.Down, Role: role, Cause: cause, Detail: "the server said so", Timeline: tl, SystemID: sys}
}

// A standby promoted while the old primary keeps running is on a newer
// timeline of the same system: with split_brain newest_timeline it is
// primary., and the old one is answered nowhere, fail-open included, with
// why in its TXT. By default (closed) primary. has no address, and its TXT
// says split brain. Two primaries of different systems (initialised apart)
// are a true split brain in either mode.
func TestSplitBrainTimelines(t *testing.T) {
	const sys = 7714602588950529522
	stale := health.ViewOf(map[string]health.Verdict{"local/pg1": upAs("primary", 1, sys), "local/pg2": upAs("primary", 2, sys), "local/pg3": upAs("standby", 0, sys)})
	apart := health.ViewOf(map[string]health.Verdict{"local/pg1": upAs("primary", 1, sys), "local/pg2": upAs("primary", 1, sys+1), "local/pg3": upAs("standby", 0, sys)})
	for _, tt := range []struct {
		name, mode string
		view       health.View
		primary    string // primary.'s addresses
		txt        string // in primary.'s TXT
		cluster    string // the cluster's addresses
	}{
		{"stale, closed", splitBrainClosed, stale, "", `"state=split_brain" "primaries=2"`, "127.0.0.11 127.0.0.12 127.0.0.13"},
		{"stale, newest_timeline", splitBrainNewestTimeline, stale, "127.0.0.12", `"state=serving" "node=pg2"`, "127.0.0.12 127.0.0.13"},
		{"apart, closed", splitBrainClosed, apart, "", `"state=split_brain" "primaries=2"`, "127.0.0.11 127.0.0.12 127.0.0.13"},
		{"apart, newest_timeline", splitBrainNewestTimeline, apart, "", `"state=split_brain" "primaries=2"`, "127.0.0.11 127.0.0.12 127.0.0.13"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			set := switchoverSettings()
			set.splitBrain = tt.mode
			s := build(buildInput{settings: set, nodes: switchoverNodes(), view: tt.view})
			if got := addrsOf(entryOf(s, "primary.local."+testZone)); got != tt.primary {
				t.Errorf("primary.: %q, want %q", got, tt.primary)
			}
			if got := txtOf(s, "primary.local."+testZone); !strings.Contains(got, tt.txt) {
				t.Errorf("primary. TXT %s, want %s", got, tt.txt)
			}
			if got := addrsOf(entryOf(s, "local."+testZone)); got != tt.cluster {
				t.Errorf("cluster: %q, want %q", got, tt.cluster)
			}
			if tt.mode == splitBrainNewestTimeline && tt.view.At("local/pg2").SystemID == sys {
				txt := txtOf(s, "pg1.local."+testZone)
				if !strings.Contains(txt, `"reason=stale_primary"`) || !strings.Contains(txt, "timeline 1 < 2") {
					t.Errorf("pg1 TXT %s: want reason=stale_primary and timeline 1 < 2", txt)
				}
			}
		})
	}

	// Every node fails its check, all_down open: the stale primary is not
	// answered by fail-open either.
	set := switchoverSettings()
	set.splitBrain, set.allDown = splitBrainNewestTimeline, allDownOpen
	down := health.ViewOf(map[string]health.Verdict{"local/pg1": downAs("primary", "refused", 1, sys), "local/pg2": downAs("primary", "refused", 2, sys),
		"local/pg3": downAs("standby", "refused", 0, sys)})
	s := build(buildInput{settings: set, nodes: switchoverNodes(), view: down})
	if got := addrsOf(entryOf(s, "primary.local."+testZone)); got != "127.0.0.12" {
		t.Errorf("all down, open: primary. %q, want the newest primary alone (127.0.0.12)", got)
	}
	if got := addrsOf(entryOf(s, "local."+testZone)); strings.Contains(got, "127.0.0.11") {
		t.Errorf("all down, open: the cluster answers the stale primary: %q", got)
	}
}

// A planned switchover as the checks see it: the primary shuts down (out at
// once, by its session), then the standby is seen promoted. In between,
// primary. keeps the old primary's address with state=held, never no
// address; once the new primary is seen it is the answer. A hold ends at
// its time when no node becomes primary, and never holds a node the
// registry took out, or one seen again as a standby.
func TestPrimaryHold(t *testing.T) {
	const sys = 42
	up := health.ViewOf(map[string]health.Verdict{"local/pg1": upAs("primary", 1, sys), "local/pg2": upAs("standby", 0, sys), "local/pg3": upAs("standby", 0, sys)})
	left := health.ViewOf(map[string]health.Verdict{"local/pg1": downAs("primary", health.CauseShuttingDown, 1, sys), "local/pg2": upAs("standby", 0, sys), "local/pg3": upAs("standby", 0, sys)})
	promoted := health.ViewOf(map[string]health.Verdict{"local/pg1": downAs("primary", health.CauseShuttingDown, 1, sys), "local/pg2": upAs("primary", 2, sys), "local/pg3": upAs("standby", 0, sys)})
	primaryOf := func(p *PgCluster) (string, string) {
		s := p.snapshot()
		return addrsOf(entryOf(s, "primary.local."+testZone)), txtOf(s, "primary.local."+testZone)
	}
	want := func(t *testing.T, p *PgCluster, addrs, txt string) {
		t.Helper()
		got, gotTXT := primaryOf(p)
		if got != addrs || !strings.Contains(gotTXT, txt) {
			t.Errorf("primary.: %q %s, want %q with %s", got, gotTXT, addrs, txt)
		}
	}

	t.Run("switchover", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, pb := servingPrimary(switchoverSettings(), up)
			want(t, p, "127.0.0.11", `"state=serving" "node=pg1"`)
			pb.setView(left)
			want(t, p, "127.0.0.11", `"state=held" "node=pg1" "reason=check_shutting_down"`)
			if got := addrsOf(entryOf(p.snapshot(), "local."+testZone)); got != "127.0.0.12 127.0.0.13" {
				t.Errorf("the cluster's name answers %q while primary. holds: want the serving nodes only", got)
			}
			if got := addrsOf(entryOf(p.snapshot(), "prefer-standby.local."+testZone)); got != "127.0.0.12 127.0.0.13" {
				t.Errorf("prefer-standby. answers %q: want the standbys", got)
			}
			time.Sleep(time.Second) // within the hold (fall x interval + timeout = 5 s)
			pb.setView(promoted)
			want(t, p, "127.0.0.12", `"state=serving" "node=pg2"`)
			time.Sleep(10 * time.Second) // the hold's timer has nothing left to end
			want(t, p, "127.0.0.12", `"state=serving" "node=pg2"`)
		})
	})

	t.Run("no successor", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, pb := servingPrimary(switchoverSettings(), up)
			pb.setView(left)
			want(t, p, "127.0.0.11", `"state=held"`)
			time.Sleep(5*time.Second - time.Millisecond)
			want(t, p, "127.0.0.11", `"state=held"`)
			time.Sleep(time.Millisecond)
			synctest.Wait()
			want(t, p, "", `"state=none"`)
			// The same primary's check changes cause: no second hold.
			pb.setView(health.ViewOf(map[string]health.Verdict{"local/pg1": downAs("primary", health.CauseRefused, 1, sys), "local/pg2": upAs("standby", 0, sys), "local/pg3": upAs("standby", 0, sys)}))
			want(t, p, "", `"state=none"`)
		})
	})

	t.Run("all_down open", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			set := switchoverSettings()
			set.allDown = allDownOpen
			p, pb := servingPrimary(set, up)
			pb.setView(left)
			want(t, p, "127.0.0.11", `"state=held"`)
			time.Sleep(5 * time.Second)
			synctest.Wait()
			// The hold ends; all_down open answers the one primary whose
			// check fails, and says so.
			want(t, p, "127.0.0.11", `"state=fail_open" "node=pg1" "reason=check_shutting_down"`)
		})
	})

	t.Run("registry takes it out", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, pb := servingPrimary(switchoverSettings(), up)
			nodes := switchoverNodes()
			nodes[0].Healthy = false
			pb.apply(nodes, nil)
			want(t, p, "", `"state=none"`)
		})
	})

	t.Run("back as a standby", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, pb := servingPrimary(switchoverSettings(), up)
			pb.setView(left)
			want(t, p, "127.0.0.11", `"state=held"`)
			pb.setView(health.ViewOf(map[string]health.Verdict{"local/pg1": upAs("standby", 0, sys), "local/pg2": upAs("standby", 0, sys), "local/pg3": upAs("standby", 0, sys)}))
			want(t, p, "", `"state=none"`)
		})
	})

	t.Run("primary_hold off", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			set := switchoverSettings()
			set.primaryHold = 0
			p, pb := servingPrimary(set, up)
			pb.setView(left)
			want(t, p, "", `"state=none"`)
		})
	})
}

// A standby promoted before the old primary's session has ended: both claim
// the role for a moment, and primary. answers the promoted one (on the
// newer timeline of the same system) rather than nothing; the old one
// leaving then changes nothing. If the old primary still claims the role
// after role_interval + timeout, it is a split brain and primary. closes.
// Claimants of different systems, or on one timeline, get no hand-over,
// nor does a promotion with split_brain newest_timeline (which answers the
// promoted one anyway) or without sessions.
func TestPrimaryHandover(t *testing.T) {
	const sys = 42
	up := health.ViewOf(map[string]health.Verdict{"local/pg1": upAs("primary", 1, sys), "local/pg2": upAs("standby", 0, sys), "local/pg3": upAs("standby", 0, sys)})
	both := health.ViewOf(map[string]health.Verdict{"local/pg1": upAs("primary", 1, sys), "local/pg2": upAs("primary", 2, sys), "local/pg3": upAs("standby", 0, sys)})
	gone := health.ViewOf(map[string]health.Verdict{"local/pg1": downAs("primary", health.CauseShuttingDown, 1, sys), "local/pg2": upAs("primary", 2, sys), "local/pg3": upAs("standby", 0, sys)})
	want := func(t *testing.T, p *PgCluster, addrs, txt string) {
		t.Helper()
		s := p.snapshot()
		got, gotTXT := addrsOf(entryOf(s, "primary.local."+testZone)), txtOf(s, "primary.local."+testZone)
		if got != addrs || !strings.Contains(gotTXT, txt) {
			t.Errorf("primary.: %q %s, want %q with %s", got, gotTXT, addrs, txt)
		}
	}
	handover := switchoverSettings().handoverFor()
	if handover != health.DefaultRoleInterval+time.Second {
		t.Fatalf("handoverFor %v, want role_interval + timeout", handover)
	}

	t.Run("old primary leaves", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, pb := servingPrimary(switchoverSettings(), up)
			pb.setView(both)
			want(t, p, "127.0.0.12", `"state=serving" "node=pg2"`)
			if n := p.snapshot().split; n != 0 {
				t.Errorf("%d clusters counted in split brain during the hand-over", n)
			}
			time.Sleep(handover / 2)
			pb.setView(gone)
			want(t, p, "127.0.0.12", `"state=serving" "node=pg2"`)
			time.Sleep(2 * handover) // past the hand-over's end: nothing to end
			synctest.Wait()
			want(t, p, "127.0.0.12", `"state=serving" "node=pg2"`)
		})
	})

	t.Run("old primary stays", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, pb := servingPrimary(switchoverSettings(), up)
			pb.setView(both)
			want(t, p, "127.0.0.12", `"state=serving" "node=pg2"`)
			time.Sleep(handover - time.Millisecond)
			want(t, p, "127.0.0.12", `"state=serving" "node=pg2"`)
			time.Sleep(time.Millisecond)
			synctest.Wait()
			want(t, p, "", `"state=split_brain" "primaries=2"`)
			if n := p.snapshot().split; n != 1 {
				t.Errorf("%d clusters counted in split brain, want 1", n)
			}
			// Still both: no second hand-over.
			pb.setView(health.ViewOf(map[string]health.Verdict{"local/pg1": upAs("primary", 1, sys), "local/pg2": upAs("primary", 2, sys), "local/pg3": downAs("standby", health.CauseRefused, 0, sys)}))
			want(t, p, "", `"state=split_brain"`)
		})
	})

	for _, tt := range []struct {
		name string
		set  func(*settings)
		view health.View
		addr string
	}{
		{"two systems", nil, health.ViewOf(map[string]health.Verdict{"local/pg1": upAs("primary", 1, sys), "local/pg2": upAs("primary", 2, sys+1), "local/pg3": upAs("standby", 0, sys)}), ""},
		{"one timeline", nil, health.ViewOf(map[string]health.Verdict{"local/pg1": upAs("primary", 1, sys), "local/pg2": upAs("primary", 1, sys), "local/pg3": upAs("standby", 0, sys)}), ""},
		{"older timeline promoted", nil, health.ViewOf(map[string]health.Verdict{"local/pg1": upAs("primary", 2, sys), "local/pg2": upAs("primary", 1, sys), "local/pg3": upAs("standby", 0, sys)}), ""},
		{"no sessions", func(s *settings) { s.roleInterval = health.NoSessions }, both, ""},
		{"newest_timeline", func(s *settings) { s.splitBrain = splitBrainNewestTimeline }, both, "127.0.0.12"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				set := switchoverSettings()
				if tt.set != nil {
					tt.set(set)
				}
				p, pb := servingPrimary(set, up)
				pb.setView(tt.view)
				want(t, p, tt.addr, "")
				if tt.addr == "" {
					want(t, p, "", `"state=split_brain"`)
				}
			})
		})
	}
}

// servingPrimary is a publisher of set with the switchover nodes and the
// view up: pg1 the serving primary.
func servingPrimary(set *settings, up health.View) (*PgCluster, *publisher) {
	p := &PgCluster{}
	pb := newPublisher(set, nil, false)
	p.pb = pb
	pb.apply(switchoverNodes(), nil)
	pb.setView(up)
	return p, pb
}

// A primary whose server ended the check's session is leaving: a standby
// promoted meanwhile is the one primary, whichever the checks hear of
// first; two primaries neither of which is leaving stay a split brain, and
// a leaving primary alone is still the primary.
func TestLeavingPrimaryIsNoSplitBrain(t *testing.T) {
	const sys = 42
	leaving := upAs("primary", 1, sys)
	leaving.Leaving = true
	for _, tt := range []struct {
		name    string
		view    health.View
		primary string
		txt     string
	}{
		{"leaving and promoted", health.ViewOf(map[string]health.Verdict{"local/pg1": leaving, "local/pg2": upAs("primary", 2, sys)}), "127.0.0.12", `"state=serving" "node=pg2"`},
		{"leaving alone", health.ViewOf(map[string]health.Verdict{"local/pg1": leaving, "local/pg2": upAs("standby", 0, sys)}), "127.0.0.11", `"state=serving" "node=pg1"`},
		{"neither leaving", health.ViewOf(map[string]health.Verdict{"local/pg1": upAs("primary", 1, sys), "local/pg2": upAs("primary", 2, sys)}), "", `"state=split_brain" "primaries=2"`},
		{"both leaving", health.ViewOf(map[string]health.Verdict{"local/pg1": leaving, "local/pg2": func() health.Verdict { v := upAs("primary", 2, sys); v.Leaving = true; return v }()}), "", `"state=split_brain" "primaries=2"`},
	} {
		s := build(buildInput{settings: switchoverSettings(), nodes: switchoverNodes()[:2], view: tt.view})
		if got := addrsOf(entryOf(s, "primary.local."+testZone)); got != tt.primary {
			t.Errorf("%s: primary. %q, want %q", tt.name, got, tt.primary)
		}
		if got := txtOf(s, "primary.local."+testZone); !strings.Contains(got, tt.txt) {
			t.Errorf("%s: primary. TXT %s, want %s", tt.name, got, tt.txt)
		}
	}
}
