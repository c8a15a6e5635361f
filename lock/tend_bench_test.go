package lock

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// benchFleet is a coordinator of a fleet of members × targets in steady
// state, without Redis: every target has a recent status from the member
// the fleet gives it to, and this instance holds its share.
func benchFleet(b *testing.B, members, targets int) (*Coordinator, Membership, []health.Target) {
	b.Helper()
	c := offlineCoordinator(b, Config{Prefix: "p:", Interval: 2 * time.Second, Timeout: 500 * time.Millisecond})
	m := Membership{Members: []string{c.Token()}, Now: time.Now()}
	for i := range members - 1 {
		m.Members = append(m.Members, fmt.Sprintf("%032x", i))
	}
	var ts []health.Target
	for i := range targets {
		ts = append(ts, health.Target{Key: fmt.Sprintf("c%d/n%d", i/3, i%3), Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, byte(i >> 16), byte(i >> 8), byte(i)}), 5432)})
	}
	c.SetTargets(ts)
	c.round(m) // the first round: coordinated, the members known
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	for _, t := range ts {
		holder := owner(m.Members, t.Key)
		if holder == c.Token() {
			c.held[t.Key] = true
		}
		st := newStatus(t.Addr, holder, time.Now(), health.Progress{Verdict: health.Verdict{State: health.Up}, OK: 3})
		st.V = now
		c.remote[t.Key] = &remoteStatus{version: now, status: st}
	}
	return c, m, ts
}

// BenchmarkTend measures what a coordinator spends per cycle (half an
// interval) at 300 members × 10,000 targets, without Redis: "cycle" is a
// round of tend with the same members (its planning) and the Claims of
// the checker's ticks in that cycle (every target ticks once an interval);
// "join" is a round in which a member came or went.
func BenchmarkTend(b *testing.B) {
	const members, targets = 300, 10_000
	b.Run("cycle", func(b *testing.B) {
		c, m, ts := benchFleet(b, members, targets)
		b.ResetTimer()
		for i := range b.N {
			c.round(m)
			for j := i % 2; j < len(ts); j += 2 {
				c.Claim(ts[j])
			}
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/cycle")
	})
	b.Run("join", func(b *testing.B) {
		c, m, _ := benchFleet(b, members, targets)
		more := Membership{Members: append(append([]string(nil), m.Members...), "ffffffffffffffffffffffffffffffff"), Now: m.Now}
		b.ResetTimer()
		for i := range b.N {
			next := m
			if i%2 == 0 {
				next = more
			}
			c.round(next)
		}
		b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/round")
	})
}

// BenchmarkView measures a View of 1,000 and 10,000 targets (20 members,
// without Redis): "whole" made from every target, "again" made from the
// last one after one status changed, as a flip published to the fleet
// asks of every instance.
func BenchmarkView(b *testing.B) {
	for _, n := range []int{1_000, 10_000} {
		b.Run(fmt.Sprintf("whole/%d", n), func(b *testing.B) {
			c, _, _ := benchFleet(b, 20, n)
			b.ReportAllocs()
			for b.Loop() {
				c.mu.Lock()
				c.signalAll()
				c.mu.Unlock()
				c.view()
			}
		})
		b.Run(fmt.Sprintf("again/%d", n), func(b *testing.B) {
			c, _, ts := benchFleet(b, 20, n)
			c.view()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				c.mu.Lock()
				c.signalKey(ts[i%len(ts)].Key)
				c.mu.Unlock()
				c.view()
				i++
			}
		})
	}
}
