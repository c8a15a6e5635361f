package discovery

import (
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// writePeriod is how often each writer goroutine writes.
const writePeriod = 3 * time.Millisecond

// The primary stops (pg_ctl stop -m fast: its sessions get 57P01) and a
// standby is promoted while the zone says held or none, then serving on
// the new node. With the read-write fallback the pool commits on the new
// primary soon after it leaves recovery, before DNS names it; without, soon
// after DNS names it. Either way new connections follow DNS once it names
// the primary.
func TestPoolFailover(t *testing.T) {
	for _, tc := range []struct {
		name     string
		held     bool
		fallback ReadWriteFallback
	}{
		{"held", true, ReadWriteFallbackOn},
		{"none", false, ReadWriteFallbackOn},
		{"held fallback off", true, ReadWriteFallbackOff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := realServer(t, "127.0.0.2")
			next := pgtest.NewStandby(t, old, pgtest.Options{Host: "127.0.0.3"})
			oldNode, nextNode := nodeOf("n1", old, "primary"), nodeOf("n2", next, "standby")
			dns := discoverytest.NewServer(t, zone)
			dns.SetTTL(5)
			dns.SetCluster("local", oldNode, nextNode)

			pool := writerPool(t, dns, WatchOptions{ReadWriteFallback: tc.fallback})
			w := startWriter(t, pool, 2, writePeriod)
			start := time.Now()
			waitFor(t, 10*time.Second, "a commit on the primary", func() bool { _, ok := w.firstOn(oldNode.Addr, start); return ok })

			stopped := time.Now()
			if err := old.StopMode("fast"); err != nil {
				t.Fatal(err)
			}
			stopTook := time.Since(stopped)
			dns.SetCluster("local", nextNode)
			want := PrimaryNone
			if tc.held {
				dns.HoldPrimary("local", oldNode)
				want = PrimaryHeld
			}
			if tc.fallback == ReadWriteFallbackOn {
				waitState(t, pool, want)
			}
			w.waitAttempts(t, 20) // the writes fail meanwhile

			promoting := time.Now()
			if err := next.Promote(); err != nil {
				t.Fatal(err)
			}
			promoted := time.Now()
			if tc.fallback == ReadWriteFallbackOn {
				c := waitForCommit(t, w, nextNode, promoting)
				t.Logf("fallback: first commit on the new primary %s after pg_ctl promote began, %s after it returned (stop -m fast took %s; writes failed from %s to %s)",
					c.done.Sub(promoting).Round(time.Millisecond), c.done.Sub(promoted).Round(time.Millisecond), stopTook.Round(time.Millisecond),
					lastCommitOn(w, oldNode).Sub(stopped).Round(time.Millisecond), c.done.Sub(stopped).Round(time.Millisecond))
				if d := c.done.Sub(promoted); d > 5*time.Second {
					t.Errorf("first commit on the new primary %s after promotion, want well under 5s", d)
				}
			}

			nextNode.Role = "primary"
			named := time.Now()
			dns.SetCluster("local", nextNode)
			dns.ReleasePrimary("local")
			c := waitForCommit(t, w, nextNode, named)
			t.Logf("DNS names the new primary: commit on it %s later", c.done.Sub(named).Round(time.Millisecond))
			if tc.fallback == ReadWriteFallbackOff {
				t.Logf("fallback off: writes failed for %s, %s of it after promotion", c.done.Sub(stopped).Round(time.Millisecond), c.done.Sub(promoting).Round(time.Millisecond))
				if n := w.countOn(nextNode.Addr, promoting); n != w.countOn(nextNode.Addr, named) {
					t.Errorf("%d commits on the new primary before DNS named it, with the fallback off", n-w.countOn(nextNode.Addr, named))
				}
			}
			seen := waitFor(t, 10*time.Second, "the Watcher's answer names the new primary", func() bool {
				return pool.Watcher().Contains(nextNode.Addr) && len(pool.Watcher().Candidates()) == 1
			})
			if tc.fallback == ReadWriteFallbackOn {
				seen = waitState(t, pool, PrimaryServing)
			}
			w.waitAttempts(t, 20)
			cs, _ := w.snapshot()
			for _, c := range cs {
				if !c.acquired.Before(seen) && c.addr != nextNode.Addr {
					t.Fatalf("a commit on %s after DNS named %s", c.addr, nextNode.Addr)
				}
			}
		})
	}
}

// waitForCommit waits for a commit on n's address done after since.
func waitForCommit(t *testing.T, w *writer, n discoverytest.Node, since time.Time) commit {
	t.Helper()
	var c commit
	waitFor(t, 30*time.Second, "a commit on "+n.Addr.String(), func() bool {
		var ok bool
		c, ok = w.firstOn(n.Addr, since)
		return ok
	})
	return c
}

// lastCommitOn returns when the last commit on n's address was done.
func lastCommitOn(w *writer, n discoverytest.Node) time.Time {
	cs, _ := w.snapshot()
	var last time.Time
	for _, c := range cs {
		if c.addr == n.Addr {
			last = c.done
		}
	}
	return last
}
