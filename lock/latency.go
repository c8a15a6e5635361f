package lock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/starve"
)

// MaxCallTimeout bounds the deadline of a Leases call however slow Redis
// has been: an instance must still notice, within a few seconds, a Redis
// that does not answer at all. A Coordinator's calls are bounded further,
// by its outage window (see bounds.callTimeout).
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
	seen bool          // a call has ended: est says something of Redis
	// lateAt: when the last call that ran out of time late ended (Unix
	// ns; see lateSince).
	lateAt atomic.Int64
}

// lateSince reports whether a call that ran out of time late ended at or
// after t, or a goroutine of this process waited starve.Bound or more to
// run since: one that ended well after its deadline (health.LateAfter)
// ran in a process starved of CPU, and in such a process an answer that
// came in time waits its turn behind the timer that ends the call. Redis
// may have answered in time, unseen. While such calls end, a call's
// deadline says more of this process than of Redis.
func (l *latency) lateSince(t time.Time) bool {
	return l.lateAt.Load() >= t.UnixNano() || starve.Since(t)
}

// timeout is the deadline of the next call. Until a call has ended, the
// latency is not known, and the calls get the longest deadline: a fleet
// started together finds Redis at its slowest then (40 instances on 2
// cores opened 3,100 to 4,900 connections to Redis in their first 5 s,
// while Redis had read the handshake of 700 to 1,800, and each call that
// gave up closed its connection for the next call to dial again).
func (l *latency) timeout() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	most := MaxCallTimeout
	if l.most > 0 {
		most = max(l.most, CallTimeout)
	}
	if !l.seen {
		return most
	}
	return min(max(CallTimeout, latencyMargin*l.est), most)
}

// observe counts a call that took d.
func (l *latency) observe(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seen = true
	if d >= l.est {
		l.est = d
		return
	}
	l.est -= (l.est - d) / latencyDecay
}

// call bounds a Redis call of l by the adaptive deadline (see latency);
// done, deferred by the caller, counts its duration.
func (l *Leases) call(ctx context.Context) (context.Context, func()) { return l.lat.call(ctx) }

// call bounds a Redis call by the adaptive deadline; done, deferred by the
// caller, counts its duration. Every Redis call an instance makes again
// and again goes through one: a fixed deadline (CallTimeout) that a Redis
// slowed by load misses closes the call's connection, the next call dials
// again and pays the handshake under the same short deadline, and so on:
// 40 instances started together on 2 cores opened over 6,000 connections
// to Redis in their first 30 s (about 525 stay open).
func (l *latency) call(ctx context.Context) (context.Context, func()) {
	start := time.Now()
	starve.Look()
	limit := l.timeout()
	cctx, cancel := context.WithTimeout(ctx, limit)
	return cctx, func() {
		took := time.Since(start)
		if took > health.LateAfter(limit) && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
			l.lateAt.Store(time.Now().UnixNano())
		}
		cancel()
		l.observe(took)
	}
}
