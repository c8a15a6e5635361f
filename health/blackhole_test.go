package health

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// probeLog wraps a Checker's probe to record, per address, when each probe
// started, how long it took and its cause. The probes themselves are real.
type probeLog struct {
	mu     sync.Mutex
	probes map[netip.AddrPort][]probeRecord
}

type probeRecord struct {
	start time.Time
	took  time.Duration
	cause string
}

func (l *probeLog) wrap(c *Checker) {
	l.probes = map[netip.AddrPort][]probeRecord{}
	inner := c.probe
	c.probe = func(ctx context.Context, addr netip.AddrPort) result {
		began := time.Now()
		r := inner(ctx, addr)
		if errors.Is(ctx.Err(), context.Canceled) {
			return r // cut short by the end of Run: the Checker drops it too
		}
		l.mu.Lock()
		l.probes[addr] = append(l.probes[addr], probeRecord{began, time.Since(began), r.cause})
		l.mu.Unlock()
		return r
	}
}

func (l *probeLog) get(addr netip.AddrPort) []probeRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.probes[addr])
}

// A backend that accepts TCP and never answers costs
// one timeout per probe, with one probe in flight, and never delays the
// checks of other backends: a healthy server keeps being probed every
// Interval while eight black holes time out.
func TestBlackHoleCostsOneTimeoutAndDelaysNoOne(t *testing.T) {
	const (
		interval = 100 * time.Millisecond
		// Long enough that the healthy server's real connect (under
		// -race, on a loaded machine) never reaches it.
		timeout = time.Second
		holes   = 8
	)
	pg := pgtest.New(t)
	// Default sslmode (prefer): pgconn would try TLS, then plain; the probe
	// as a whole still costs one timeout.
	c := mustNew(t, Config{Check: CheckPostgres, Options: pgOptions, Interval: interval, Timeout: timeout, Rise: 1, Fall: 1})
	var log probeLog
	log.wrap(c)
	targets := []Target{{"c/pg", pgAddr(pg)}}
	var holeSrv []*server
	for i := range holes {
		s := listen(t, "127.0.0.1:0")
		holeSrv = append(holeSrv, s)
		targets = append(targets, Target{fmt.Sprintf("c/hole%d", i), s.addr})
	}
	c.SetTargets(targets)
	rec, stop := start(t, c, 0)

	// Long enough for every black hole to time out three times, and for
	// the healthy server to be probed ten times (on a loaded machine its
	// probes may take longer than an Interval each).
	err := pgtest.WaitFor(20*time.Second, func() error {
		if n := len(log.get(pgAddr(pg))); n < 10 {
			return fmt.Errorf("healthy server probed %d times, want 10", n)
		}
		for _, s := range holeSrv {
			if n := len(log.get(s.addr)); n < 3 {
				return fmt.Errorf("black hole %v probed %d times, want 3", s.addr, n)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := rec.last()
	stop()

	// A probe is due an Interval after the previous one started, or as it
	// ends when it took longer (a real connect under -race on a loaded
	// machine may): how late each started beyond that is what a black
	// hole holding up the others would show, a Timeout or more.
	healthy := log.get(pgAddr(pg))
	var worst, total time.Duration
	for i, p := range healthy {
		if p.cause != CauseOK {
			t.Errorf("healthy probe %d: %s", i, p.cause)
		}
		if i > 0 {
			prev := healthy[i-1]
			late := max(0, p.start.Sub(prev.start)-max(interval, prev.took))
			worst = max(worst, late)
			total += late
		}
	}
	mean := total / time.Duration(len(healthy)-1)
	if mean > interval/2 || worst > 150*time.Millisecond {
		t.Errorf("healthy server's probes started %v late on average, %v at worst: want on time (every %v), not delayed by the black holes", mean, worst, interval)
	}
	span := healthy[len(healthy)-1].start.Sub(healthy[0].start) / time.Duration(len(healthy)-1)
	t.Logf("healthy: %d probes, every %v on average, %v late at worst", len(healthy), span.Round(time.Millisecond), worst.Round(time.Millisecond))

	for _, s := range holeSrv {
		ps := log.get(s.addr)
		for i, p := range ps {
			// The probe's own deadline starts a moment before the observer
			// reads the clock: allow a little on the short side.
			if p.cause != CauseTimeout || p.took < timeout-20*time.Millisecond || p.took > timeout+300*time.Millisecond {
				t.Errorf("black hole %v probe %d: %s after %v, want timeout after one Timeout (%v)", s.addr, i, p.cause, p.took, timeout)
			}
			if i > 0 && p.start.Before(ps[i-1].start.Add(ps[i-1].took)) {
				t.Errorf("black hole %v probe %d started before probe %d ended: two in flight", s.addr, i, i-1)
			}
		}
		if err := s.waitOpen(0, time.Second); err != nil {
			t.Errorf("black hole: %v", err)
		}
	}
	for k, vd := range v.All() {
		want := Down
		if k == "c/pg" {
			want = Up
		}
		if vd.State != want || (want == Down && vd.Cause != CauseTimeout) {
			t.Errorf("%s: %v/%s, want %v", k, vd.State, vd.Cause, want)
		}
	}
	if v.Len() != len(targets) {
		t.Errorf("%d targets judged, want %d", v.Len(), len(targets))
	}
}
