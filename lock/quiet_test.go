package lock

import (
	"context"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// A holder does not rewrite a status whose verdict does not change at
// every probe: it stores it again once per rewrite period, and extends
// its lease meanwhile, so that the lease never lapses and the stored
// status never grows older than a reader trusts. A lease whose target it
// stops probing (a checker stuck) is not extended: it lapses.
func TestQuietStatusLeaseKept(t *testing.T) {
	s := redistest.Start(t)
	rdb := newClient(t, s)
	_, targets := newBackends(t, 1)
	tg := targets[0]
	cfg := Config{Prefix: "fleet:", Interval: fleetInterval, Timeout: fleetTimeout, Logf: t.Logf}
	coord, err := NewCoordinator(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	coord.SetTargets(targets)
	runInstance(t, coord, nil) // probed by hand below
	b := coord.b
	ctx := context.Background()
	lease, status := leaseKey(cfg.Prefix, tg.Key), statusKey(cfg.Prefix, tg.Key)
	ours := func() bool { v, _ := rdb.Get(ctx, lease).Result(); return v == coord.Token() }
	version := func() int64 { v, _ := rdb.HGet(ctx, status, "v").Int64(); return v }

	probe := func() {
		if ok, _ := coord.Claim(tg); ok {
			coord.Record(tg, health.Progress{Verdict: health.Verdict{State: health.Up, Cause: health.CauseOK, Last: time.Now()}, OK: 1})
		}
	}
	eventually(t, 10*time.Second, "the lease was not taken and the status written", func() bool {
		probe()
		return ours() && version() > 0
	})

	// Probed every interval with the same verdict, for ten rewrite periods.
	var probes, writes int
	last, lastAt := version(), time.Now()
	var oldest time.Duration
	end := time.Now().Add(10 * b.rewrite())
	next := time.Now()
	for time.Now().Before(end) {
		if !time.Now().Before(next) {
			probe()
			probes++
			next = next.Add(b.interval)
		}
		if !ours() {
			t.Fatalf("the lease lapsed or left this instance after %d probes of an unchanged verdict", probes)
		}
		if v := version(); v != last {
			writes++
			last, lastAt = v, time.Now()
		}
		oldest = max(oldest, time.Since(lastAt))
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("%d probes, %d status writes; the stored status at most %v old (rewrite period %v, readers trust %v)", probes, writes, oldest, b.rewrite(), b.storedAge())
	if writes > 12 || writes*3 > probes {
		t.Errorf("%d status writes for %d probes of an unchanged verdict over ten rewrite periods: rewritten at probes", writes, probes)
	}
	if oldest > b.storedAge() {
		t.Errorf("the stored status went %v without a rewrite, longer than readers trust a stored status (%v)", oldest, b.storedAge())
	}

	// No more probes: the lease is not extended again, and lapses.
	stopped := time.Now()
	eventually(t, 10*time.Second, "the lease of a target no longer probed did not lapse", func() bool { return !ours() })
	if d := time.Since(stopped); d < b.extendAfter() {
		t.Errorf("the lease lapsed %v after the last probe, before half a lease (%v): not extended while probed", d, b.extendAfter())
	}
}
