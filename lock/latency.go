package lock

import (
	"context"
	"sync"
	"time"
)

// MaxCallTimeout bounds the deadline of a Leases call however slow Redis
// has been: an instance must still notice, within a few seconds, a Redis
// that does not answer at all. A Coordinator's calls are bounded further,
// by half its outage window (see bounds.callTimeout).
const MaxCallTimeout = 2 * time.Second

// Bounds of the adaptive deadline (see latency).
const (
	// latencyMargin is how many times the latency seen a call may take.
	latencyMargin = 4
	// latencyDecay: each call faster than the estimate moves it down by
	// this fraction of the difference, so that one slow call counts for
	// about this many calls after it (a p99-ish estimate at a few calls a
	// second per instance).
	latencyDecay = 64
)

// latency is a decaying maximum of the durations of an instance's Redis
// calls: a call slower than the estimate raises it to its own duration at
// once, a faster one lowers it by 1/latencyDecay of the difference. A call
// that ran into its deadline counts with the time it was given, so that
// the next one gets more. The deadline of the next call is latencyMargin
// times the estimate, within [CallTimeout, most] (most is MaxCallTimeout
// unless set lower): a Redis slowed by a loaded machine is given time
// rather than taken for gone, and one that does not answer still costs at
// most that per call.
type latency struct {
	mu   sync.Mutex
	est  time.Duration
	most time.Duration // the longest deadline; 0 is MaxCallTimeout
}

// timeout is the deadline of the next call.
func (l *latency) timeout() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	most := MaxCallTimeout
	if l.most > 0 {
		most = l.most
	}
	return min(max(CallTimeout, latencyMargin*l.est), max(most, CallTimeout))
}

// observe counts a call that took d.
func (l *latency) observe(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d >= l.est {
		l.est = d
		return
	}
	l.est -= (l.est - d) / latencyDecay
}

// call bounds a Redis call of l by the adaptive deadline (see latency);
// done, deferred by the caller, counts its duration.
func (l *Leases) call(ctx context.Context) (context.Context, func()) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, l.lat.timeout())
	return ctx, func() {
		cancel()
		l.lat.observe(time.Since(start))
	}
}
