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
