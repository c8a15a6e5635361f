package discovery

import (
	"context"
	"time"
)

// run is the Watcher's loop: wait for the earliest of its schedules (the
// name's, the primary's, and for a Pool of primary.CLUSTER the primary's
// state) or a nudge, resolve what is due, report changes.
func (w *Watcher) run(ctx context.Context, primaryErr error) {
	defer close(w.done)
	v := w.view.Load()
	w.scout.track(w.scouted(v))
	w.emit(nil, v.answer.Candidates, false, ReasonInitial)
	w.emit(nil, v.primary.Candidates, true, ReasonInitial)

	var mainFails, primFails int
	if primaryErr != nil {
		primFails = 1
		w.failed(primaryErr)
	}
	now := time.Now()
	last := now
	mainIn, mainWhy := w.opts.next(v.answer.TTL, 0)
	mainIn = w.soon(v, mainIn)
	primIn, _ := w.opts.next(v.primary.TTL, primFails)
	nextMain, nextPrim, nextPoll := now.Add(mainIn), now.Add(primIn), now.Add(w.opts.StateInterval)
	for {
		due := nextMain
		if w.primary != "" && nextPrim.Before(due) {
			due = nextPrim
		}
		polls := w.polls(w.view.Load())
		if polls && nextPoll.Before(due) {
			due = nextPoll
		}
		nudged, ok := w.wait(ctx, due, last)
		if !ok {
			return
		}
		now = time.Now()
		why := nudged
		if why == 0 {
			why = mainWhy
		}
		doMain := nudged != 0 || !now.Before(nextMain)
		// The state is asked for only when no resolution read it within
		// StateInterval, so that polls and the resolutions they start
		// keep to one per MinWatchInterval.
		if !doMain && polls && !now.Before(nextPoll) {
			if w.stateMoved(ctx) {
				doMain, why = true, ReasonPrimary
			}
			nextPoll = time.Now().Add(w.opts.StateInterval)
		}
		if w.primary != "" && (nudged != 0 || !now.Before(nextPrim)) {
			changed, err := w.resolvePrimary(ctx, why)
			primFails = fails(primFails, err)
			primIn, _ = w.opts.next(w.view.Load().primary.TTL, primFails)
			nextPrim = now.Add(primIn)
			if changed {
				doMain, why = true, ReasonPrimary
			}
		}
		if doMain {
			mainFails = fails(mainFails, w.resolveMain(ctx, why))
			v := w.view.Load()
			w.scout.track(w.scouted(v))
			if w.fallbackOn(v) && w.opts.onFallback != nil {
				w.opts.onFallback()
			}
			mainIn, mainWhy = w.opts.next(v.answer.TTL, mainFails)
			if mainFails == 0 {
				mainIn = w.soon(v, mainIn)
			}
			last, nextMain = now, now.Add(mainIn)
			nextPoll = now.Add(w.opts.StateInterval)
		}
	}
}

// scouted returns the nodes the scout keeps track of while v is current:
// the cluster's serving nodes during the read-write fallback, none
// otherwise.
func (w *Watcher) scouted(v *view) []Candidate {
	if w.fallbackOn(v) {
		return v.fallback.Candidates
	}
	return nil
}

// wait blocks until due or a nudge, which it returns (0 for due). A nudge
// is held back until MinInterval after the last resolution, an urgent one
// (see urge) until MinWatchInterval after it, also when it comes while a
// nudge is held back. It returns false when ctx ends.
func (w *Watcher) wait(ctx context.Context, due, last time.Time) (Reason, bool) {
	t := time.NewTimer(time.Until(due))
	defer t.Stop()
	var r Reason
	hold := w.opts.MinInterval
	select {
	case <-ctx.Done():
		return 0, false
	case <-t.C:
		return 0, true
	case r = <-w.nudges:
	case r = <-w.urgent:
		hold = MinWatchInterval
	}
	for {
		held := time.NewTimer(time.Until(last.Add(hold)))
		select {
		case <-ctx.Done():
			held.Stop()
			return 0, false
		case <-held.C:
			return r, true
		case <-w.urgent:
			held.Stop()
			hold = MinWatchInterval
		}
	}
}

// resolveMain resolves the watched name, publishes the answer and reports
// the changes.
func (w *Watcher) resolveMain(ctx context.Context, why Reason) error {
	w.mu.Lock()
	w.started++
	w.mu.Unlock()

	ans, st, err := w.resolveName(ctx)
	if err == nil {
		old := w.view.Load()
		v := &view{answer: ans, set: setOf(ans), primary: old.primary, state: st}
		v.fallback, v.fallbackSet = w.resolveFallback(ctx, st, old)
		w.view.Store(v)
		w.ranks.reset()
		w.emit(old.answer.Candidates, ans.Candidates, false, why)
		if w.opts.onServeLost != nil && lost(w.served(old), w.served(v)) {
			w.opts.onServeLost()
		}
	} else if ctx.Err() == nil {
		w.failed(err)
	}

	w.mu.Lock()
	w.finished++
	w.lastErr = err
	close(w.progress)
	w.progress = make(chan struct{})
	w.mu.Unlock()
	return err
}

// resolvePrimary resolves the primary's name, publishes the answer and
// reports whether it changed.
func (w *Watcher) resolvePrimary(ctx context.Context, why Reason) (bool, error) {
	ans, err := w.resolve(ctx, w.primary)
	if err != nil {
		if ctx.Err() == nil {
			w.failed(err)
		}
		return false, err
	}
	old := w.view.Load()
	v := *old
	v.primary = ans
	w.view.Store(&v)
	return w.emit(old.primary.Candidates, ans.Candidates, true, why), nil
}

// emit reports the candidates that left (in old order) then those that
// joined (in new order), and whether there were any.
func (w *Watcher) emit(old, cur []Candidate, primary bool, why Reason) bool {
	changed := false
	for _, c := range old {
		if !containsAddr(cur, c) {
			changed = true
			w.event(Event{Kind: Removed, Candidate: c, Primary: primary, Reason: why})
		}
	}
	for _, c := range cur {
		if !containsAddr(old, c) {
			changed = true
			w.event(Event{Kind: Added, Candidate: c, Primary: primary, Reason: why})
		}
	}
	return changed
}

func (w *Watcher) event(e Event) {
	if w.opts.OnEvent != nil {
		w.opts.OnEvent(e)
	}
}

func (w *Watcher) failed(err error) {
	if w.opts.OnError != nil {
		w.opts.OnError(err)
	}
}

// containsAddr reports whether cs holds c's address.
func containsAddr(cs []Candidate, c Candidate) bool {
	for _, x := range cs {
		if x.Addr == c.Addr {
			return true
		}
	}
	return false
}

// fails counts failures in a row.
func fails(n int, err error) int {
	if err != nil {
		return n + 1
	}
	return 0
}
