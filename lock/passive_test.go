package lock

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// startPassive starts a passive follower of the fleet cfg on rdb: a
// coordinator with no checker.
func startPassive(t *testing.T, rdb redis.UniversalClient, targets []health.Target, cfg Config) *instance {
	t.Helper()
	cfg.Passive = true
	coord, err := NewCoordinator(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	coord.SetTargets(targets)
	return runInstance(t, coord, nil)
}

// A passive instance follows the fleet's verdicts without probing and
// without being anybody's owner: the active members hold every lease
// between them and the backends are probed once per interval as without
// it; a backend that goes down is down in its view; while Redis does not
// answer it keeps the last verdicts it read (and still probes nothing),
// and it follows again when Redis returns.
func TestCoordinatorPassive(t *testing.T) {
	srv := redistest.Start(t)
	backends, targets := newBackends(t, 6)
	cfg := Config{Prefix: "fleet:", Interval: fleetInterval, Timeout: fleetTimeout, Resync: time.Second, Logf: t.Logf}
	active := []*instance{startInstance(t, newClient(t, srv), targets), startInstance(t, newClient(t, srv), targets)}
	p := startPassive(t, newClient(t, srv), targets, cfg)
	all := append(active[:2:2], p)
	eventually(t, 10*time.Second, "every instance, the passive one too, sees every backend up", allState(all, targets, health.Up))
	eventually(t, 10*time.Second, "the active members hold every lease between them", func() bool {
		total, _ := totalHeld(active)
		return total == len(targets)
	})
	if n := len(p.coord.Held()); n != 0 {
		t.Fatalf("the passive instance holds %d leases", n)
	}
	// Members are read once a cycle: the passive instance's first read
	// may have come before the active ones joined, and its View, made
	// from their statuses, before its next.
	eventually(t, 5*time.Second, "the passive instance counts the 2 active members, not itself", func() bool { return p.coord.Members() == 2 })

	backends[0].ln.Close()
	eventually(t, 5*time.Second, "the passive instance sees the closed backend down", allState([]*instance{p}, targets[:1], health.Down))

	srv.Stop()
	eventually(t, 5*time.Second, "the passive instance notices Redis is gone", func() bool { return p.coord.Mode() == ModeLocal })
	if !allState([]*instance{p}, targets[:1], health.Down)() || !allState([]*instance{p}, targets[1:], health.Up)() {
		t.Fatal("without Redis, the passive instance dropped the verdicts it had read")
	}
	if n := p.coord.Members(); n != 0 {
		t.Fatalf("without Redis, Members() = %d, want 0", n)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the passive instance follows again", func() bool {
		return p.coord.Mode() == ModeCoordinated && p.coord.Members() == 2
	})
}

// Statuses are signed for their segment: one written by a segment's holder
// and copied under another segment's prefix is refused there, so that a
// node one part of the network can reach is never taken up by another
// that cannot.
func TestSegmentStatusNotReplayable(t *testing.T) {
	srv := redistest.Start(t)
	b := newBackend(t)
	targets := []health.Target{{Key: "c/n0", Addr: b.addr}}
	secret := []byte("fleet secret")
	a := startInstance(t, newClient(t, srv), targets, func(c *Config) { c.Prefix, c.Segment, c.Secret = "seg/a:", "zone/r/a", secret })
	eventually(t, 10*time.Second, "segment a's holder writes its status", allState([]*instance{a}, targets, health.Up))
	rdb := newClient(t, srv)
	ctx := context.Background()
	stored, err := rdb.HGet(ctx, statusKey("seg/a:", "c/n0"), "s").Bytes()
	if err != nil {
		t.Fatal(err)
	}
	cfgA := Config{Prefix: "seg/a:", Segment: "zone/r/a", Secret: secret, Interval: fleetInterval, Timeout: fleetTimeout}
	cfgB := cfgA
	cfgB.Prefix, cfgB.Segment = "seg/b:", "zone/r/b"
	st, err := decode(cfgA.macKey("c/n0"), stored, secret)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	if _, err := cfgA.VetStatus("c/n0", st.V, stored, now); err != nil {
		t.Fatalf("segment a refuses its own holder's status: %v", err)
	}
	if _, err := cfgB.VetStatus("c/n0", st.V, stored, now); err == nil {
		t.Fatal("segment b accepts a status signed for segment a")
	}
}

// A coordinator with QuietModes (a passive follower of another segment,
// beside the instance's own) logs no change of mode: its instance's own
// coordinator says Redis is gone, once.
func TestCoordinatorQuietModes(t *testing.T) {
	srv := redistest.Start(t)
	b := newBackend(t)
	targets := []health.Target{{Key: "c/n0", Addr: b.addr}}
	startInstance(t, newClient(t, srv), targets)
	var mu sync.Mutex
	var lines []string
	cfg := Config{Prefix: "fleet:", Interval: fleetInterval, Timeout: fleetTimeout, Resync: time.Second, QuietModes: true,
		Logf: func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, fmt.Sprintf(format, args...))
		}}
	p := startPassive(t, newClient(t, srv), targets, cfg)
	eventually(t, 10*time.Second, "the quiet follower follows", func() bool { return p.coord.Mode() == ModeCoordinated })
	srv.Stop()
	eventually(t, 5*time.Second, "the quiet follower notices Redis is gone", func() bool { return p.coord.Mode() == ModeLocal })
	mu.Lock()
	defer mu.Unlock()
	for _, l := range lines {
		if strings.Contains(l, "Redis answers") || strings.Contains(l, "Redis does not answer") || strings.Contains(l, "a Redis call failed") {
			t.Errorf("a coordinator with QuietModes logged its mode: %q", l)
		}
	}
}
