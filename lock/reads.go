package lock

import (
	"context"
	"time"
)

// readJob is a read of stored statuses the rules call for (see reads).
type readJob struct {
	all   bool              // every stored status, paced
	after bool              // the read after a return
	sub   bool              // the read a subscription made (again) calls for
	gen   uint64            // the subscription it began after (see readPast)
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
//   - a key whose stored status a read found too old to count but newer
//     than the one applied here, once its holder has rewritten it (see
//     applyRemote);
//   - every stored status once a subscription was made (again), at once
//     (see beforeResync);
//   - every stored status once the holders have rewritten theirs after a
//     return (see plan): those that went local too at once, those that
//     did not once their quiet statuses were rewritten (see
//     bounds.rewrite); and every Resync as a safety net (see
//     bounds.safetyEvery), each paced over about a cycle, so that a fleet
//     reading together does not take Redis from its other calls.
//
// A read that fails is tried again a cycle later.
func (c *Coordinator) reads(ctx context.Context) {
	c.everyCycle(ctx, c.readWake, func() {
		if j, ok := c.nextRead(); ok {
			c.read(ctx, j)
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
	j := readJob{at: c.now(), marks: map[string]uint64{}, gen: c.subGen}
	switch {
	case !c.subReadAt.IsZero() && !now.Before(c.subReadAt):
		c.subReadAt = time.Time{}
		j.all, j.sub = true, true
	case !c.resyncAt.IsZero() && !now.Before(c.resyncAt):
		c.resyncAt = time.Time{}
		j.all, j.after = true, true
	case !c.rereadAt.IsZero() && !now.Before(c.rereadAt):
		c.rereadAt = time.Time{}
		j.all, j.after = true, true
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
	for k, at := range c.rereads {
		if _, ok := c.targets[k]; !ok {
			delete(c.rereads, k)
		} else if !now.Before(at) {
			delete(c.rereads, k)
			j.keys = append(j.keys, k)
		}
	}
	if len(j.keys) > 0 {
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

// read does j, applying what it reads as the subscription's reads are
// applied, and notes how far it read past each holder's watermark.
func (c *Coordinator) read(ctx context.Context, j readJob) {
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
		pause := c.pace()
		if j.sub && !c.isSynced() {
			// The first: a cold start answers from what it reads.
			pause = 0
		}
		err = c.sub.scan(ctx, pause, apply)
		c.observe(func(o Observer) { o.Resync(err) })
		if j.sub {
			// Done with the first read, or given up on it: Run
			// answers from what it has, and reads again on failure.
			c.syncOnce.Do(func() { close(c.synced) })
		}
	} else {
		if len(j.marks) > 0 {
			c.gapReads.Add(1)
		}
		err = c.sub.readKeys(ctx, j.keys, apply)
	}
	if err != nil {
		if ctx.Err() == nil {
			c.rlog.Logf("read", "%v (again in %v)", err, c.b.interval)
			c.retry(j)
		}
		return
	}
	c.readPast(j)
}

// retry plans a full read j that failed again an interval later: a read
// of every status fails on a loaded Redis or machine, and trying it again
// at once would load both further. (A gap's read is tried again at the
// next tick: the gap stays pending, and its statuses cover their targets
// for a handoff at most.)
func (c *Coordinator) retry(j readJob) {
	c.mu.Lock()
	defer c.mu.Unlock()
	again := time.Now().Add(c.b.interval)
	switch {
	case !j.all && len(j.marks) == 0:
		for _, k := range j.keys {
			c.rereads[k] = again
		}
	case j.sub:
		c.subReadAt = again
	case j.after:
		c.resyncAt = again
	case j.all:
		c.safetyAt = again
	}
}

// isSynced reports whether the first read of every stored status has
// completed or failed (see awaitSynced).
func (c *Coordinator) isSynced() bool {
	select {
	case <-c.synced:
		return true
	default:
		return false
	}
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
