package discovery

import (
	"testing"
	"time"
)

// Between resolutions a pool of primary.CLUSTER asks for the primary's
// state, one TXT query every StateInterval; a Watcher that serves no pool
// asks nothing between resolutions.
func TestStatePollQueries(t *testing.T) {
	c := newCluster(t, 0, 0)
	c.dns.SetTTL(3600)
	cl := c.client(t, Config{})
	const name = "primary.local.pgcluster.lan"
	for _, tc := range []struct {
		name     string
		pool     bool
		opts     WatchOptions
		min, max int64 // queries in a second
	}{
		{"pool, default", true, WatchOptions{}, 2, 11},
		{"pool, 250ms", true, WatchOptions{StateInterval: 250 * time.Millisecond}, 1, 5},
		{"pool, fallback off", true, WatchOptions{ReadWriteFallback: ReadWriteFallbackOff}, 2, 11},
		{"pool, an hour", true, WatchOptions{StateInterval: time.Hour}, 0, 0},
		{"Watch", false, WatchOptions{}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.pool {
				p, err := cl.NewPool(t.Context(), "postgres://app@"+name+"/db?sslmode=disable", tc.opts)
				if err != nil {
					t.Fatal(err)
				}
				defer p.Close()
			} else {
				watch(t, cl, name, tc.opts)
			}
			q0, t0 := c.dns.Queries(), time.Now()
			waitFor(t, 10*time.Second, "a second", func() bool { return time.Since(t0) >= time.Second })
			n, el := c.dns.Queries()-q0, time.Since(t0)
			t.Logf("%d queries in %s", n, el.Round(time.Millisecond))
			if rate := float64(n) / el.Seconds(); rate < float64(tc.min) || rate > float64(tc.max) {
				t.Errorf("%d queries in %s, want %d to %d a second", n, el.Round(time.Millisecond), tc.min, tc.max)
			}
		})
	}
}

// A Watcher's LookupFunc returns an answer of one candidate (primary.'s)
// without probing it: there is nothing to rank, and the connection finds
// out whether it answers.
func TestLookupOneCandidateUnprobed(t *testing.T) {
	c := newCluster(t, 0, 0)
	w, _ := watch(t, c.client(t, Config{}), "primary.local.pgcluster.lan", WatchOptions{})
	before := c.pgs[0].Accepted()
	got, err := w.LookupFunc()(t.Context(), "primary.local.pgcluster.lan")
	if err != nil || len(got) != 1 || got[0] != c.nodes[0].Addr.String() {
		t.Fatalf("LookupFunc = %v, %v; want the primary %s", got, err, c.nodes[0].Addr)
	}
	if n := c.pgs[0].Accepted() - before; n != 0 {
		t.Errorf("%d probe connections to the one candidate, want none", n)
	}
}
