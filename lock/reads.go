package lock

import (
	"context"
	"time"
)

// readJob is a read of stored statuses the rules call for (see reads).
type readJob struct {
	all   bool              // every stored status, paced
	after bool              // a piece of the rejoin's reads (see rejoinPiece)
	keys  []string          // else these targets'
	marks map[string]uint64 // the holders read past, and the watermark each reaches
	at    int64             // Redis's clock at its start, µs
}

// reads reads stored statuses again when the rules call for it, until ctx
// is done, one read at a time:
//
//   - the statuses of a holder with a gap (see feed), at once: the keys
//     the fleet gives it among the targets, a round trip per 256;
//   - those of a holder that numbers nothing, every legacyResync, as
//     every instance once read every status;
//   - after a return, once the holders have rewritten their statuses
//     (see plan), those of the targets still not covered, in pieces of a
//     round trip each, paced (see rejoinPiece): each piece counts when it
//     succeeds, and a target whose piece failed, or that its holder had
//     not rewritten yet, is read again a cycle later;
//   - every stored status every Resync as a safety net (see
//     bounds.safetyEvery), paced over about a cycle, so that a fleet
//     reading together does not take Redis from its other calls.
//
// A read of every status that fails is tried again an interval later.
func (c *Coordinator) reads(ctx context.Context) {
	c.everyCycle(ctx, c.readWake, func() {
		for {
			j, ok := c.nextRead()
			if !ok || !c.read(ctx, j) || !j.after || sleep(ctx, c.pace()) != nil {
				return
			}
		}
	})
}

// everyCycle calls fn every cycle, and at once whenever wake fires (a nil
// wake never does), until ctx is done.
func (c *Coordinator) everyCycle(ctx context.Context, wake <-chan struct{}, fn func()) {
	t := time.NewTicker(c.b.cycle)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-wake:
		}
		fn()
	}
}

// signalRead tells reads there may be something to read.
func (c *Coordinator) signalRead() {
	select {
	case c.readWake <- struct{}{}:
	default:
	}
}

// nextRead returns the read the rules call for now, if any (see reads).
func (c *Coordinator) nextRead() (readJob, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mode != ModeCoordinated {
		return readJob{}, false
	}
	now := time.Now()
	j := readJob{at: c.now(), marks: map[string]uint64{}}
	if !c.resyncAt.IsZero() && !now.Before(c.resyncAt) {
		keys, more := c.rejoinPiece(now)
		switch {
		case len(c.targets) == 0:
			// A cold start keeps every status it may answer from.
			c.resyncAt, c.rejoinRead = time.Time{}, nil
			j.all = true
		case !more || !now.Before(c.rejoinEnd):
			c.resyncAt, c.rejoinRead = time.Time{}, nil
		case len(keys) > 0:
			j.keys, j.after = keys, true
			return j, true
		}
	}
	switch {
	case !c.safetyAt.IsZero() && !now.Before(c.safetyAt):
		c.safetyAt = now.Add(c.b.safetyEvery(len(c.memberList)))
		j.all = true
	}
	if j.all {
		j.marks = c.marks()
		for _, f := range c.feeds {
			f.readAt = now
		}
		return j, true
	}
	holders := map[string]bool{}
	for tok, f := range c.feeds {
		switch {
		case !c.members[tok]:
		case f.pending != 0:
			holders[tok] = true
			j.marks[tok] = f.pending
			if len(f.due) > 0 {
				j.marks[tok] = max(f.pending, f.due[len(f.due)-1].mark)
			}
		case !f.numbers && now.Sub(f.readAt) >= legacyResync:
			holders[tok] = true
			f.readAt = now
		}
	}
	if len(holders) == 0 {
		return readJob{}, false
	}
	if len(c.targets) == 0 {
		j.all = true // a cold start keeps every status it may answer from
		return j, true
	}
	for k := range c.targets {
		if holders[c.owners[k]] {
			j.keys = append(j.keys, k)
		}
	}
	return j, true
}

// rejoinPiece returns the next piece of the rejoin's reads after a
// return: up to scanCount targets (a round trip) that no status since the
// return covers, whose owner is another live member, and that were not
// read in the last cycle; and whether any such target remains, read
// lately or not. Holders rewrite their statuses at every probe, but
// publish only what changed or what they took over: a status a holder
// rewrote since the return, and whose publish this instance missed (its
// subscription was coming back too), is found by reading it, not by
// waiting for a read of every status to succeed whole. c.mu is held.
func (c *Coordinator) rejoinPiece(now time.Time) (keys []string, more bool) {
	me := c.Token()
	for k, addr := range c.targets {
		if o := c.owners[k]; o == me || !c.members[o] || c.covered(k, addr) {
			continue
		}
		more = true
		if len(keys) == scanCount || now.Sub(c.rejoinRead[k]) < c.b.cycle {
			continue
		}
		c.rejoinRead[k] = now
		keys = append(keys, k)
	}
	return keys, more
}

// rejoinReads is how long the rejoin's reads go on at most (see
// rejoinPiece): two intervals, in which every live holder has rewritten
// every status it holds twice; a target still not covered then is probed
// here until its holder's status is heard, or read by the safety net.
func (b bounds) rejoinReads() time.Duration { return 2 * b.interval }

// read does j, applying what it reads as the subscription's reads are
// applied, and notes how far it read past each holder's watermark. It
// reports whether the read succeeded.
func (c *Coordinator) read(ctx context.Context, j readJob) bool {
	apply := func(got []Stored) {
		for _, s := range got {
			if s.Err != nil {
				c.rejected(s.Key, s.Err)
				continue
			}
			c.applyRemote(s.Key, s.Version, s.Status, false)
		}
	}
	var err error
	if j.all {
		err = c.sub.scan(ctx, c.pace(), apply)
		c.observe(func(o Observer) { o.Resync(err) })
	} else {
		if len(j.marks) > 0 {
			c.gapReads.Add(1)
		}
		err = c.sub.readKeys(ctx, j.keys, apply)
	}
	if err != nil {
		if ctx.Err() == nil {
			again := c.b.interval
			if j.after {
				again = c.b.cycle
			}
			c.rlog.Logf("read", "%v (again in %v)", err, again)
			c.retry(j)
		}
		return false
	}
	c.readPast(j.marks, j.at)
	return true
}

// retry plans a full read j that failed again an interval later: a read
// of every status fails on a loaded Redis or machine, and trying it again
// at once would load both further. (A gap's read is tried again at the
// next tick: the gap stays pending, and its statuses cover their targets
// for a handoff at most. A piece of the rejoin's reads is tried again a
// cycle later, with the targets still not covered: see rejoinPiece.)
func (c *Coordinator) retry(j readJob) {
	if !j.all {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.safetyAt = time.Now().Add(c.b.interval)
}

// pace is the pause between the steps of a read of every stored status,
// so that it spreads over about a cycle: a SCAN step reads up to
// scanCount keys, a target has two (its lease and its status).
func (c *Coordinator) pace() time.Duration {
	c.mu.Lock()
	n := len(c.targets)
	c.mu.Unlock()
	steps := max(2*n/scanCount, 1)
	return min(c.b.cycle/time.Duration(steps), c.b.cycle/4)
}
