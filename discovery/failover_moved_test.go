package discovery

import (
	"fmt"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
)

// A pool writing on the primary stops writing there soon after the zone
// stops naming it, although that server still takes writes and the
// answer's TTL is far off: two nodes claim to be primary (split brain: the
// pool writes nowhere), or another node is the primary (pgcluster's
// split_brain newest_timeline names a promoted standby and answers the
// primary it replaced nowhere: the pool moves there).
func TestPoolStopsWritingWhenZoneMovesPrimary(t *testing.T) {
	for _, tc := range []struct {
		name  string
		split bool
	}{
		{"split brain", true},
		{"another primary", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, q := realServer(t, "127.0.0.2"), realServer(t, "127.0.0.3")
			pn, qn := nodeOf("n1", p, "primary"), nodeOf("n2", q, "standby") // q takes writes all the same
			dns := discoverytest.NewServer(t, zone)
			dns.SetTTL(30)
			dns.SetCluster("local", pn, qn)
			pool := writerPool(t, dns, WatchOptions{})
			w := startWriter(t, pool, 2, writePeriod)
			start := time.Now()
			waitFor(t, 10*time.Second, "a commit on the primary", func() bool { _, ok := w.firstOn(pn.Addr, start); return ok })

			qn.Role = "primary"
			want := PrimaryState{Status: PrimarySplitBrain, Primaries: 2}
			if !tc.split {
				pn.Role, want = "standby", PrimaryState{Status: PrimaryServing, Node: "n2"}
			}
			changed := time.Now()
			dns.SetCluster("local", pn, qn)
			seen := waitFor(t, 10*time.Second, fmt.Sprintf("the Watcher reads %+v", want), func() bool { return pool.Watcher().PrimaryState() == want })
			waitFor(t, 10*time.Second, "two seconds of writes", func() bool { return time.Since(changed) >= 2*time.Second })
			last := lastCommitOn(w, pn)
			t.Logf("the zone stopped naming the primary: the pool read it %s later; its last commit there ended %s after the change",
				seen.Sub(changed).Round(time.Millisecond), last.Sub(changed).Round(time.Millisecond))
			if d := last.Sub(changed); d > time.Second {
				t.Errorf("the pool committed on the old primary %s after the zone stopped naming it (TTL 30 s), want within a second", d)
			}
			if tc.split {
				if n := w.countOn(pn.Addr, seen) + w.countOn(qn.Addr, seen); n != 0 {
					t.Errorf("%d writes acquired after the pool read the split brain committed", n)
				}
				return
			}
			c := waitForCommit(t, w, qn, changed)
			t.Logf("first commit on the primary the zone names now: %s after the change", c.done.Sub(changed).Round(time.Millisecond))
		})
	}
}
