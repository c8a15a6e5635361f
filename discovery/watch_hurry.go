package discovery

import "time"

// hurryFor is how long after an error of a switchover the Watcher keeps
// resolving at MinWatchInterval while its answer has no primary to use.
// Every such error starts it again: while writes keep failing, it lasts.
const hurryFor = 5 * time.Second

// urge marks a switchover under way and asks the loop to resolve again at
// the floor (MinWatchInterval after the last resolution) rather than
// MinInterval. However many errors urge it, the loop resolves at most once
// per floor: the channel holds one request, and the loop takes it only
// after the previous resolution.
func (w *Watcher) urge(r Reason) {
	w.hurryUntil.Store(time.Now().Add(hurryFor).UnixNano())
	w.signalUrgent(r)
}

// signalUrgent asks for a resolution at the floor; one already pending
// covers it.
func (w *Watcher) signalUrgent(r Reason) {
	select {
	case w.urgent <- r:
	default:
	}
}

// hurrying reports whether a switchover error was reported less than
// hurryFor ago.
func (w *Watcher) hurrying() bool { return time.Now().UnixNano() < w.hurryUntil.Load() }

// soon shortens d, the time until the next resolution of the watched name
// by TTL and timer: to MinWatchInterval while a switchover is under way
// and the answer has no primary to use (no address, or a held one); to
// MinInterval while connections go through the read-write fallback, so
// that they come back to DNS's primary soon after it names one, and close
// soon after it sees a split brain.
func (w *Watcher) soon(v *view, d time.Duration) time.Duration {
	if !w.writer {
		return d
	}
	if (len(v.answer.Candidates) == 0 || v.state.Status == PrimaryHeld) && w.hurrying() {
		return min(d, MinWatchInterval)
	}
	if w.fallbackOn(v) {
		return min(d, w.opts.MinInterval)
	}
	return d
}
