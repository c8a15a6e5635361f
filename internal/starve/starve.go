// Package starve tells whether this process has been starved of CPU
// lately: whether a goroutine of it waited Bound or more to run, by the
// runtime's own count (/sched/latencies:seconds).
//
// A call given a deadline that runs out while the process is starved says
// little of the peer: the timer that ends it runs first (the goroutine it
// wakes runs next), while an answer that came in time waits behind every
// goroutine already queued, and can be seen after the deadline, or not at
// all. 40 instances started together on 2 cores took Redis's answers that
// way for an outage, and their backends' for failures.
package starve

import (
	"runtime/metrics"
	"sync"
	"time"
)

// Bound is how long a goroutine waiting to run counts as starved: far
// above what a process that runs gets (microseconds, a millisecond in a
// garbage collection's pause), and a tenth of the default probe timeout.
const Bound = 100 * time.Millisecond

const latencies = "/sched/latencies:seconds"

var (
	mu        sync.Mutex
	sample    = []metrics.Sample{{Name: latencies}}
	prev      []uint64  // the counts at the last look
	starvedAt time.Time // when the last look that found a wait of Bound or more was
)

// Look notes, at the start of a call given a deadline, what the runtime
// has counted so far, so that Since judges the waits from then on (it
// judges those since the last look, which is then no earlier).
func Look() {
	mu.Lock()
	defer mu.Unlock()
	look()
}

// Since reports whether a goroutine of this process waited Bound or more
// to run since t (or since the last Look before t).
func Since(t time.Time) bool {
	mu.Lock()
	defer mu.Unlock()
	look()
	return !starvedAt.Before(t)
}

// look reads the runtime's counts and notes a wait of Bound or more since
// the last look. mu is held.
func look() {
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return // a runtime without the metric: never starved
	}
	h := sample[0].Value.Float64Histogram()
	now := time.Now()
	if len(prev) == len(h.Counts) {
		for i, c := range h.Counts {
			if h.Buckets[i] >= Bound.Seconds() && c > prev[i] {
				starvedAt = now
				break
			}
		}
	}
	prev = append(prev[:0], h.Counts...)
}
