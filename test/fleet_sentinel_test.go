package test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// fleetPrefix is the redis_prefix of the fleet tests that read the keys
// themselves (README: <prefix>members, <prefix>{<cluster>/<node>}:lease and
// :status).
const fleetPrefix = "pgfleet:"

// keptBy checks, by reading the keys on one Redis server, that the fleet
// keeps its state there: n members, a lease on every one of the backends
// held by one of them, and every backend's status written after since (a
// status's version is at least Redis's clock in µs when it was written, and
// a holder rewrites its status at each probe).
func (f *fleet) keptBy(t testing.TB, s *redistest.Server, members int, since time.Time) func() error {
	c := s.Client(t)
	return func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		tokens, err := c.ZRange(ctx, fleetPrefix+"members", 0, -1).Result()
		if err != nil {
			return fmt.Errorf("members on %s: %w", s.Addr(), err)
		}
		if len(tokens) != members {
			return fmt.Errorf("%d members on %s, want %d", len(tokens), s.Addr(), members)
		}
		for i := range f.backends {
			key := fleetPrefix + "{local/n" + strconv.Itoa(i) + "}"
			holder, err := c.Get(ctx, key+":lease").Result()
			if err != nil {
				return fmt.Errorf("lease of backend %d on %s: %w", i, s.Addr(), err)
			}
			if !slices.Contains(tokens, holder) {
				return fmt.Errorf("lease of backend %d on %s held by %q, not a member", i, s.Addr(), holder)
			}
			vs, err := c.HGet(ctx, key+":status", "v").Result()
			if err != nil {
				return fmt.Errorf("status of backend %d on %s: %w", i, s.Addr(), err)
			}
			v, err := strconv.ParseInt(vs, 10, 64)
			if err != nil {
				return fmt.Errorf("status of backend %d on %s: version %q: %w", i, s.Addr(), vs, err)
			}
			if v < since.UnixMicro() {
				return fmt.Errorf("status of backend %d on %s last written %v before %v", i, s.Addr(),
					since.Sub(time.UnixMicro(v)).Round(time.Millisecond), since.Format(time.StampMilli))
			}
		}
		return nil
	}
}

// all is every condition of conds, in order.
func all(conds ...func() error) func() error {
	return func() error {
		for _, c := range conds {
			if err := c(); err != nil {
				return err
			}
		}
		return nil
	}
}

// modeLines returns the lines of an instance's log, from offset on, that
// say it changed mode.
func modeLines(in *Instance, offset int) []string {
	var out []string
	for _, l := range strings.Split(in.Log()[offset:], "\n") {
		if strings.Contains(l, "Redis does not answer") || strings.Contains(l, "Redis answers") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

// onePerBackend checks that in a window starting now each backend is
// probed about once per interval, not once per instance.
func (f *fleet) onePerBackend(t *testing.T, window time.Duration, what string) {
	t.Helper()
	from := time.Now()
	time.Sleep(window) // a measurement window
	to := time.Now()
	single := float64(to.Sub(from) / f.opts.interval)
	for i, b := range f.backends {
		n := float64(len(b.AcceptsIn(from, to)))
		t.Logf("%s: backend %d probed %v times in %v (one prober: %v)", what, i, n, to.Sub(from).Round(time.Millisecond), single)
		if n > 1.6*single || n < 0.5*single {
			t.Errorf("%s: backend %d probed %v times in %v; one prober makes %v", what, i, n, to.Sub(from), single)
		}
	}
}

// A fleet of three bin/coredns processes on a Redis Sentinel group (a
// master, a replica, three sentinels), given as a redis-sentinel:// URL:
// coordinated through the master, it rides a failover without a failed
// answer, coordinates again through the promoted replica, and a flip after
// the failover reaches all three as fast as before it (within a second,
// not at the next resync), from one prober per backend.
func TestFleetSentinel(t *testing.T) {
	const interval, timeout = 200 * time.Millisecond, 100 * time.Millisecond
	g := redistest.StartSentinel(t)
	f := newFleet(t, fleetOptions{interval: interval, timeout: timeout, backends: 4, extra: []string{"redis_prefix " + fleetPrefix}})
	corefile := f.corefile(g.URL())
	ins := startInstances(t, corefile, 3)
	first := g.Master()
	Eventually(t, 20*time.Second, all(coordinated(t, ins, len(f.backends)), f.keptBy(t, first, len(ins), time.Now())))
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts()))

	down := f.dropTimes(t, ins, 0, true)
	up := f.dropTimes(t, ins, 0, false)
	t.Logf("before the failover (master %s): flip spread between instances: down %v, up %v", first.Addr(), spread(down), spread(up))

	// The failover, with every instance asked all along.
	g.WaitSynced(t)
	marks := make([]int, len(ins))
	for k, in := range ins {
		marks[k] = len(in.Log())
	}
	stop := make(chan struct{})
	done := keepAnswering(t, ins, stop)
	asked := time.Now()
	g.Failover(t)
	switched := time.Now()
	next := g.Master()
	if next == first {
		t.Fatalf("Failover left the master on %s", first.Addr())
	}
	Eventually(t, 30*time.Second, all(coordinated(t, ins, len(f.backends)), f.keptBy(t, next, len(ins), switched)))
	again := time.Now()
	// Answers keep being checked for a few more intervals after it.
	time.Sleep(5 * interval)
	close(stop)
	slowest := done()
	t.Logf("failover %s → %s: sentinels switched %v after SENTINEL FAILOVER; fleet coordinated again through the new master "+
		"(every instance coordinated, %d leases, %d members and every status rewritten there) %v after the switch, %v after the request; slowest answer meanwhile %v",
		first.Addr(), next.Addr(), switched.Sub(asked).Round(time.Millisecond), len(f.backends), len(ins), again.Sub(switched).Round(time.Millisecond),
		again.Sub(asked).Round(time.Millisecond), slowest.Round(time.Microsecond))
	if slowest > 250*time.Millisecond {
		t.Errorf("an answer took %v during the failover (a Redis call on the query path?)", slowest)
	}
	for k, in := range ins {
		lines := modeLines(in, marks[k])
		t.Logf("instance %d: %d mode changes during the failover %q", k, len(lines), lines)
	}

	// The fleet keeps coordinating through the new master.
	down = f.dropTimes(t, ins, 1, true)
	up = f.dropTimes(t, ins, 1, false)
	t.Logf("after the failover (master %s): flip spread between instances: down %v, up %v", next.Addr(), spread(down), spread(up))
	for k := range ins {
		t.Logf("instance %d saw backend 1 down %v and up %v after the switch", k, down[k].Sub(switched).Round(time.Millisecond), up[k].Sub(switched).Round(time.Millisecond))
	}
	// The other backends meanwhile: one prober each, or more if an
	// instance took a holder for gone for want of its statuses.
	end := up[0]
	for _, tm := range up {
		if tm.After(end) {
			end = tm
		}
	}
	for i, b := range f.backends {
		if i != 1 {
			t.Logf("backend %d probed %d times in the %v from coordinated again to the end of the flip (one prober: %d)",
				i, len(b.AcceptsIn(again, end)), end.Sub(again).Round(time.Millisecond), int64(end.Sub(again)/interval))
		}
	}
	// The holder publishes on the new master. An instance whose
	// subscription stayed on the old one hears of it only at its next
	// resync (every 10 s), or once the sentinels turn the old master into
	// a replica (they kill its pub/sub clients then, which subscribe again,
	// to the new master).
	for what, times := range map[string][]time.Time{"down": down, "up": up} {
		if s := spread(times); s > time.Second {
			t.Errorf("after the failover, backend 1 going %s reached the last instance %v after the first: "+
				"the published status did not reach every instance (a subscription left on the old master?)", what, s.Round(time.Millisecond))
		}
	}
	f.onePerBackend(t, 2*time.Second, "after the failover")
	Eventually(t, 10*time.Second, all(coordinated(t, ins, len(f.backends)), f.keptBy(t, next, len(ins), time.Now())))
}
