package lock

import (
	"context"
	"time"
)

// Work that every change asks for (a View of every target, the scan of
// the targets not checked yet) is paced: a burst of statuses (a fleet
// started together, a storm of flips) asks for it after each one, and at
// a thousand targets each run costs a pass over them all plus, for a
// View, a new zone. A change that comes after a quiet spell is handled at
// once; within a burst, runs are spaced by paceShare times the last one's
// duration, within [paceFloor, paceCeil], so that they take at most
// about 1/paceShare of the time (a tenth), and each covers every change
// since the one before. On a starved machine a run takes longer, and the
// spacing grows with it.
const (
	paceFloor = 5 * time.Millisecond
	paceShare = 10
	paceCeil  = 100 * time.Millisecond
)

// pacer spaces the runs of one kind of work (see paceShare).
type pacer struct {
	done time.Time     // when the last run ended
	took time.Duration // how long it took
}

// wait returns once the next run is due, or with ctx's error.
func (p *pacer) wait(ctx context.Context) error {
	gap := min(max(paceFloor, paceShare*p.took), paceCeil)
	if d := time.Until(p.done.Add(gap)); d > 0 {
		return sleep(ctx, d)
	}
	return nil
}

// ran notes that a run begun at start has just ended.
func (p *pacer) ran(start time.Time) {
	p.done = time.Now()
	p.took = p.done.Sub(start)
}
