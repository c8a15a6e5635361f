package lock

import (
	"net/netip"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// A verdict this instance made while it probed a target (in local mode, or
// before a holder's status covered it) is dropped once a live holder's
// status covers the target: when that holder dies, the view falls back to
// the holder's last status, not to this instance's own, older verdict,
// until this instance's own first probe. Found by the chaos run: a backend
// down for seconds answered after a SIGKILL of its prober, from the "up" a
// survivor had recorded long before in local mode.
func TestCoordinatorDropsOwnWhenCovered(t *testing.T) {
	c := offlineCoordinator(t, Config{Prefix: "p:", Interval: 100 * time.Millisecond, Timeout: 50 * time.Millisecond, Resync: time.Second})
	tg := health.Target{Key: "c/a", Addr: netip.MustParseAddrPort("192.0.2.1:5432")}
	c.SetTargets([]health.Target{tg})

	// Local mode: this instance probes the target and finds it up.
	c.mode = ModeLocal
	if probe, _ := c.Claim(tg); !probe {
		t.Fatal("local mode: the target is not probed here")
	}
	c.Record(tg, health.Progress{Verdict: health.Verdict{State: health.Up}, OK: 3})
	if s := c.view().At(tg.Key).State; s != health.Up {
		t.Fatalf("own verdict in local mode: %v, want up", s)
	}

	// Redis is back; another instance holds the lease and finds it down.
	c.mode = ModeCoordinated
	c.plan(Membership{Members: []string{"holder"}, Now: time.Now()}, nil) // the fleet gives the key to it
	down := newStatus(tg.Addr, "holder", time.Now(), health.Progress{Verdict: health.Verdict{State: health.Down, Cause: "refused"}, Fail: 3})
	down.V = time.Now().UnixMicro()
	c.remote[tg.Key] = &remoteStatus{version: down.V, status: down}
	if probe, _ := c.Claim(tg); probe {
		t.Fatal("a live holder's status covers the target, yet it is probed here")
	}
	if s := c.view().At(tg.Key).State; s != health.Down {
		t.Fatalf("covered by the holder: %v, want down", s)
	}

	// The holder dies: until this instance probes, its last status counts.
	c.plan(Membership{Now: time.Now()}, nil)
	probe, start := c.Claim(tg)
	if !probe || start.Verdict.State != health.Down {
		t.Fatalf("holder gone: probe %v from %+v, want a probe from the holder's down", probe, start)
	}
	if s := c.view().At(tg.Key).State; s != health.Down {
		t.Fatalf("holder gone, before this instance's first probe: %v, want the holder's down, not the old own up", s)
	}
}
