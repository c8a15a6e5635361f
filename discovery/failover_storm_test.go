package discovery

import (
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// maxResolutionsPerSecond is the Watcher's budget: one resolution per
// MinWatchInterval.
const maxResolutionsPerSecond = float64(time.Second / MinWatchInterval)

// A storm of switchover errors from many pooled connections — the primary
// refuses every connection, the fallback's node is read-only — makes the
// Watcher resolve at its floor, never more than ten times a second.
func TestPoolErrorStormResolutionRate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		fallback ReadWriteFallback
	}{
		{"fallback to a read-only node", ReadWriteFallbackOn},
		{"fallback off, primary refuses", ReadWriteFallbackOff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := realServer(t, "127.0.0.2")
			ro := pgtest.New(t, pgtest.Options{Host: "127.0.0.3", Settings: map[string]string{"default_transaction_read_only": "on"}})
			pn, ron := nodeOf("n1", p, "primary"), nodeOf("n2", ro, "standby")
			dns := discoverytest.NewServer(t, zone)
			dns.SetCluster("local", pn, ron)
			pool := writerPool(t, dns, WatchOptions{ReadWriteFallback: tc.fallback})
			if err := p.StopMode("fast"); err != nil {
				t.Fatal(err)
			}
			dns.SetCluster("local", ron)
			dns.HoldPrimary("local", pn)

			w := startWriter(t, pool, 32, time.Millisecond)
			w.waitAttempts(t, 64) // the storm is on
			wt := pool.Watcher()
			r0, q0, t0 := wt.resolutions(), dns.Queries(), time.Now()
			waitFor(t, 10*time.Second, "two seconds of storm", func() bool { return time.Since(t0) >= 2*time.Second })
			r1, q1, el := wt.resolutions(), dns.Queries(), time.Since(t0)
			_, attempts := w.snapshot()
			w.stop()
			rate := float64(r1-r0) / el.Seconds()
			t.Logf("%d write attempts in all; %d resolutions (%d DNS queries) in %s: %.1f resolutions/s, %.0f queries/s",
				attempts, r1-r0, q1-q0, el.Round(time.Millisecond), rate, float64(q1-q0)/el.Seconds())
			if rate > maxResolutionsPerSecond || r1-r0 == 0 {
				t.Errorf("%.1f resolutions/s under the storm, want at most %.0f and some", rate, maxResolutionsPerSecond)
			}
			if cs, _ := w.snapshot(); len(cs) != 0 {
				t.Errorf("%d writes committed on a read-only node or a stopped one", len(cs))
			}
		})
	}
}

// ReportError from many goroutines at once, switchover errors and others
// mixed: one resolution per floor at most, and the first at once.
func TestReportErrorStormResolutionRate(t *testing.T) {
	c := newCluster(t, 0)
	c.dns.SetTTL(3600)
	w, _ := watch(t, c.client(t, Config{}), "primary.local.pgcluster.lan", WatchOptions{Interval: time.Hour})
	created := time.Now()
	waitFor(t, 10*time.Second, "twice MinWatchInterval since the first resolution", func() bool {
		return time.Since(created) > 2*MinWatchInterval
	})
	before := w.resolutions()
	first := time.Now()
	w.ReportError(&pgconn.PgError{Code: "57P01"})
	waitFor(t, 10*time.Second, "the first resolution", func() bool { return w.resolutions() > before })
	t.Logf("first resolution %s after the first 57P01 (MinInterval %s)", time.Since(first).Round(time.Microsecond), DefaultMinInterval)
	if d := time.Since(first); d > DefaultMinInterval {
		t.Errorf("first resolution %s after the error, want it at once, not after MinInterval", d)
	}

	r0, t0 := w.resolutions(), time.Now()
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			tick := time.NewTicker(time.Millisecond) // 64,000 errors a second in all
			defer tick.Stop()
			for range tick.C {
				if time.Since(t0) > 2*time.Second {
					return
				}
				switch i % 3 {
				case 0:
					w.ReportError(&pgconn.PgError{Code: "57P01"})
				case 1:
					w.ReportError(&pgconn.PgError{Code: "25006"})
				default:
					w.ReportError(errConnRefusedForTest)
				}
			}
		})
	}
	wg.Wait()
	el := time.Since(t0)
	rate := float64(w.resolutions()-r0) / el.Seconds()
	t.Logf("64 goroutines reporting errors for %s: %d resolutions, %.1f/s", el.Round(time.Millisecond), w.resolutions()-r0, rate)
	if rate > maxResolutionsPerSecond {
		t.Errorf("%.1f resolutions/s, want at most %.0f", rate, maxResolutionsPerSecond)
	}
	if rate < maxResolutionsPerSecond/4 {
		t.Errorf("%.1f resolutions/s while switchover errors keep coming, want about %.0f (MinWatchInterval), not MinInterval's 2", rate, maxResolutionsPerSecond)
	}
}
