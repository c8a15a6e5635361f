package lock

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// A target covered by its holder's status is remembered as covered
// (coverMemo), so that the Claims of every probe tick do not look the
// status, its holder's feed and its owner up each time; the memory must
// never keep a target from being probed here once that status stops
// covering it: a status of another writer applied, the holder gone from
// the members, the status's time run out, the registry's address moved,
// a return from local mode.
func TestCoverMemoForgotten(t *testing.T) {
	cases := []struct {
		name   string
		change func(t *testing.T, c *Coordinator, other string, tg health.Target, m Membership) health.Target
	}{
		{"a status of another writer applied", func(t *testing.T, c *Coordinator, other string, tg health.Target, m Membership) health.Target {
			applyOf(t, c, fmt.Sprintf("%032x", 3), tg, up(2)) // no member's: anyone's write
			return tg
		}},
		{"the holder gone from the members", func(t *testing.T, c *Coordinator, other string, tg health.Target, m Membership) health.Target {
			c.round(Membership{Members: []string{c.Token()}, Now: time.Now()})
			return tg
		}},
		{"the status's time run out", func(t *testing.T, c *Coordinator, other string, tg health.Target, m Membership) health.Target {
			c.mu.Lock()
			c.offset += c.b.cover() + time.Second
			c.mu.Unlock()
			return tg
		}},
		{"the address moved", func(t *testing.T, c *Coordinator, other string, tg health.Target, m Membership) health.Target {
			moved := tg
			moved.Addr = netip.AddrPortFrom(tg.Addr.Addr(), tg.Addr.Port()+1)
			var ts []health.Target
			for k, a := range c.targets {
				if k == tg.Key {
					a = moved.Addr
				}
				ts = append(ts, health.Target{Key: k, Addr: a})
			}
			c.SetTargets(ts)
			return moved
		}},
		{"a return from local mode", func(t *testing.T, c *Coordinator, other string, tg health.Target, m Membership) health.Target {
			c.mu.Lock()
			c.offset += time.Millisecond // local mode begins after the status was written
			c.goLocal()
			c.mu.Unlock()
			c.round(Membership{Members: m.Members, Now: time.Now().Add(time.Millisecond)})
			return tg
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, other, tg, m := pairedCoordinator(t)
			applyOf(t, c, other, tg, up(2))
			for i := range 2 {
				c.mu.Lock()
				covered := c.covered(tg.Key, tg.Addr)
				c.mu.Unlock()
				if !covered {
					t.Fatalf("the holder's status does not cover the target (look %d)", i+1)
				}
			}
			c.mu.Lock()
			_, memo := c.covers[tg.Key]
			c.mu.Unlock()
			if !memo {
				t.Fatal("a covered target left no coverMemo: the test tests nothing")
			}
			tg = tc.change(t, c, other, tg, m)
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.covered(tg.Key, tg.Addr) {
				t.Fatalf("after %s, the holder's status still covers the target", tc.name)
			}
		})
	}
}

// applyOf applies a status of holder's for tg, written now, as a message.
func applyOf(t *testing.T, c *Coordinator, holder string, tg health.Target, p health.Progress) {
	t.Helper()
	st := newStatus(tg.Addr, holder, time.Now(), p)
	c.mu.Lock()
	st.V = c.now()
	c.mu.Unlock()
	c.applyRemote(tg.Key, st.V, encode(c.cfg.macKey(tg.Key), st, c.cfg.Secret), true)
}

// A target covered by a holder whose feed is confirmed is parked long
// (parkFed), not asked about again every cover: its cover goes on with
// the feed's confirmations. When they stop, the sweep has every parked
// target asked about again before the cover lapses, once; the target is
// then parked only until the lapse, and uncovered after it. A cover
// that rests on the status's version alone (its holder's feed never
// confirmed here) is parked only until it lapses.
func TestClaimParkedByFeed(t *testing.T) {
	c, other, tg, _ := pairedCoordinator(t)
	rechecked := 0
	c.SetRecheck(func(string) {}, func() {})
	applyOf(t, c, other, tg, up(2))
	c.mu.Lock()
	c.feeds[other] = &feed{numbers: true, confirmed: c.now() + 1} // a heartbeat since the status
	c.mu.Unlock()
	claim := func() (bool, time.Duration) {
		probe, _, until := c.ClaimParked(tg) // by this machine's clock
		return probe, time.Until(until)
	}
	sweep := func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.recheckAll = false
		c.sweepLapses()
		if c.recheckAll {
			rechecked++
		}
		return c.recheckAll
	}
	pass := func(d time.Duration) {
		c.mu.Lock()
		c.offset += d
		c.mu.Unlock()
	}

	if probe, park := claim(); probe || park < parkFed-time.Second {
		t.Fatalf("covered by a confirmed feed: probe %v, parked for %v, want parked for %v", probe, park, parkFed)
	}
	if sweep() {
		t.Fatal("the sweep asked about the parked targets again while the feed is confirmed")
	}
	// The feed stops being confirmed: two intervals before the cover
	// lapses, the sweep asks again, once.
	pass(c.b.cover() - 2*c.b.interval + c.b.cycle)
	if !sweep() {
		t.Fatal("the feed's cover is about to lapse: the sweep did not ask about the parked targets again")
	}
	if sweep() {
		t.Fatal("the sweep asked again a second time for the same lapse")
	}
	probe, park := claim()
	if probe || park > 2*c.b.interval || park <= 0 {
		t.Fatalf("about to lapse: probe %v, parked for %v, want parked until the lapse (within %v)", probe, park, 2*c.b.interval)
	}
	pass(park + time.Millisecond)
	c.mu.Lock()
	covered := c.covered(tg.Key, tg.Addr)
	c.mu.Unlock()
	if covered {
		t.Fatal("the cover lapsed: the holder's status still covers the target")
	}
	if rechecked != 1 {
		t.Fatalf("%d sweeps asked again, want 1", rechecked)
	}

	// A feed never confirmed here: the cover rests on the version.
	c2, other2, tg2, _ := pairedCoordinator(t)
	c2.SetRecheck(func(string) {}, func() {})
	c2.mu.Lock()
	c2.feeds[other2] = &feed{numbers: true}
	c2.mu.Unlock()
	applyOf(t, c2, other2, tg2, up(2))
	probe, _, until := c2.ClaimParked(tg2)
	park = time.Until(until)
	if probe || park > c2.b.cover() {
		t.Fatalf("covered by its version alone: probe %v, parked for %v, want at most the cover (%v)", probe, park, c2.b.cover())
	}
}
