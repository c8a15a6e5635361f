package discovery

import (
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
)

// Two real primaries, and the zone says split_brain: the pool never writes
// through the fallback, neither before the fallback was ever used nor
// after, once the Watcher has seen the split brain again, and it closes
// the connections the fallback made.
func TestPoolSplitBrainNeverFallsBack(t *testing.T) {
	p, q := realServer(t, "127.0.0.2"), realServer(t, "127.0.0.3")
	pn, qn := nodeOf("n1", p, "primary"), nodeOf("n2", q, "primary")
	dns := discoverytest.NewServer(t, zone)
	dns.SetCluster("local", pn, qn)

	pool := writerPool(t, dns, WatchOptions{})
	if st := pool.Watcher().PrimaryState(); st.Status != PrimarySplitBrain || st.Primaries != 2 {
		t.Fatalf("state %+v, want split_brain with 2 primaries", st)
	}
	w := startWriter(t, pool, 2, writePeriod)
	w.waitAttempts(t, 100)
	if cs, attempts := w.snapshot(); len(cs) != 0 {
		t.Fatalf("split brain: %d of %d writes committed (on %s), want none", len(cs), attempts, cs[0].addr)
	}

	// With state=none the same pool does write through the fallback: the
	// gate above is not a pool that cannot write.
	pn.Role, qn.Role = "standby", "standby"
	dns.SetCluster("local", pn, qn)
	none := waitState(t, pool, PrimaryNone)
	waitFor(t, 10*time.Second, "a commit through the fallback", func() bool {
		cs, _ := w.snapshot()
		return len(cs) > 0
	})
	t.Logf("state=none: first commit through the fallback %s after the Watcher read it", firstCommit(w).done.Sub(none).Round(time.Millisecond))

	pn.Role, qn.Role = "primary", "primary"
	dns.SetCluster("local", pn, qn)
	seen := waitState(t, pool, PrimarySplitBrain)
	w.waitAttempts(t, 100)
	if n := w.countOn(pn.Addr, seen) + w.countOn(qn.Addr, seen); n != 0 {
		t.Errorf("%d writes acquired after the Watcher saw the split brain committed", n)
	}
	waitFor(t, 10*time.Second, "the fallback's connections closed", func() bool {
		st := pool.Stat()
		return st.IdleConns()+st.AcquiredConns() == 0
	})
}

// The zone names a serving primary that has stopped, while another node of
// the cluster takes writes: the pool never goes there (DNS names the
// primary; only the zone's change moves it).
func TestPoolServingNeverFallsBack(t *testing.T) {
	p, q := realServer(t, "127.0.0.2"), realServer(t, "127.0.0.3")
	pn, qn := nodeOf("n1", p, "primary"), nodeOf("n2", q, "standby") // q takes writes all the same
	dns := discoverytest.NewServer(t, zone)
	dns.SetCluster("local", pn, qn)

	pool := writerPool(t, dns, WatchOptions{})
	w := startWriter(t, pool, 2, writePeriod)
	start := time.Now()
	waitFor(t, 10*time.Second, "a commit on the primary", func() bool { _, ok := w.firstOn(pn.Addr, start); return ok })
	if err := p.StopMode("fast"); err != nil {
		t.Fatal(err)
	}
	w.waitAttempts(t, 100)
	if st := pool.Watcher().PrimaryState(); st.Status != PrimaryServing || st.Node != "n1" {
		t.Errorf("state %+v, want serving n1", st)
	}
	if n := w.countOn(qn.Addr, start); n != 0 {
		t.Errorf("%d writes committed on %s, which DNS does not name", n, qn.Addr)
	}
}

// Connections made through the fallback to a node that is not the primary
// DNS then names are closed: none is handed out again, and new ones go to
// DNS's primary.
func TestPoolLeavesFallbackWhenDNSNames(t *testing.T) {
	p, q, r := realServer(t, "127.0.0.2"), realServer(t, "127.0.0.3"), realServer(t, "127.0.0.4")
	pn, qn, rn := nodeOf("n1", p, "primary"), nodeOf("n2", q, "standby"), nodeOf("n3", r, "primary")
	dns := discoverytest.NewServer(t, zone)
	dns.SetCluster("local", pn, qn)

	pool := writerPool(t, dns, WatchOptions{})
	w := startWriter(t, pool, 4, writePeriod)
	start := time.Now()
	waitFor(t, 10*time.Second, "a commit on the primary", func() bool { _, ok := w.firstOn(pn.Addr, start); return ok })
	if err := p.StopMode("fast"); err != nil {
		t.Fatal(err)
	}
	dns.SetCluster("local", qn)
	dns.HoldPrimary("local", pn)
	waitForCommit(t, w, qn, start)

	dns.SetCluster("local", qn, rn)
	seen := waitState(t, pool, PrimaryServing)
	c := waitForCommit(t, w, rn, seen)
	t.Logf("DNS names another primary: first commit on it %s after the Watcher read it", c.done.Sub(seen).Round(time.Millisecond))
	w.waitAttempts(t, 100)
	if n := w.countOn(qn.Addr, seen); n != 0 {
		t.Errorf("%d writes acquired on the fallback's node after DNS named another primary", n)
	}
	waitFor(t, 10*time.Second, "every connection on DNS's primary", func() bool {
		for _, c := range pool.AcquireAllIdle(t.Context()) {
			addr, _ := remoteAddr(c.Conn().PgConn().Conn())
			c.Release()
			if addr != rn.Addr {
				return false
			}
		}
		return true
	})
}

// firstCommit returns the writer's first commit.
func firstCommit(w *writer) commit {
	cs, _ := w.snapshot()
	return cs[0]
}
