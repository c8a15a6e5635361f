package lock

import "time"

// feed is what this instance knows of one holder's publishes. A holder
// numbers them (status.Seq) and stores the number of its last one Redis
// confirmed, its watermark, at each heartbeat (Membership.Watermarks).
// What was heard of it is the highest number among its messages, or the
// watermark a read of its statuses began after (a read finds whatever it
// published before). A watermark read at a heartbeat and still not
// reached gapAfter later, once this instance's subscription has heard
// back a marker of its own published after that heartbeat
// (Subscriber.CaughtUp), is
// a gap: a message of its was lost (a subscription deaf since a
// fail-over, a client's buffer overrun, a bug), and its statuses are read
// again (see reads). A message delivered late (a loaded machine, a
// subscriber behind a burst of takes' first publishes) is no gap: each
// watermark waits from the heartbeat that read it, the oldest one unmet
// first, so that a holder publishing all the time is not found missing
// just because its newest watermark is always a little ahead, and a
// subscriber still working through what was published before it is
// behind, not deaf.
//
// While a gap is pending its statuses still cover their targets for a
// handoff (see vouched): the read that repairs it takes a round trip, and
// every instance probing a holder's targets at once for that would be a
// storm of the fleet's own making.
//
// Pub/Sub delivers a connection's messages in order or loses them all
// from some point until it resubscribes (and reads every status again);
// so the highest number heard, not every number, is what counts, and a
// number a holder gave a publish whose write failed costs nothing.
type feed struct {
	got     uint64    // the highest number heard of it, or read past
	gotAt   time.Time // when got was last raised by a message
	due     []due     // watermarks read at heartbeats and not reached yet, oldest first, rising
	pending uint64    // > 0: a gap; the watermark its read must reach
	gapAt   time.Time // when the gap was found
	numbers bool      // it has stored a watermark: it numbers its publishes
	fresh   bool      // its next watermark counts as reached (see noteMarks)
	// confirmed is Redis's clock (µs) at the last heartbeat whose
	// watermark of it was reached, or at the start of the last read of
	// its statuses: what is known of its statuses was current then.
	confirmed int64
	swept     int64     // the confirmation whose covers' lapse the parked keys were asked again at (see sweepLapses)
	seen      time.Time // when a heartbeat last found it live
	readAt    time.Time // when its statuses were last read again (one that numbers nothing: see reads)
}

// due is a watermark read at a heartbeat and not reached yet.
type due struct {
	mark uint64
	read time.Time // when the heartbeat that read it answered, by our clock
	at   int64     // Redis's clock then, µs
}

// maxDue bounds the watermarks a feed waits for. A newer one read while
// it waits for as many is not kept: the next heartbeat after one of them
// is reached reads it again (or a higher one), so that a gap among the
// newest is found a few cycles later, never missed.
const maxDue = 8

// gapAfter is how long a watermark read at a heartbeat may stay unreached
// before it is a gap: two cycles and the longest a Redis call may take,
// so that a message its holder published just before storing the
// watermark, delivered late by a loaded machine, is not taken for lost.
func (b bounds) gapAfter() time.Duration { return 2*b.cycle + MaxCallTimeout }

// handoff is how long a holder's statuses keep covering their targets
// once a gap is found in its publishes, while they are read again: an
// interval, a probe and a cycle (a read that takes longer than that has
// failed, and the instances probe those targets themselves).
func (b bounds) handoff() time.Duration { return b.interval + b.timeout + b.cycle }

// maxFeeds bounds the holders this instance keeps a feed of: the live
// members, and holders heard of before a heartbeat finds them live (so
// that a new member's first publishes are not taken for lost). A flood
// of messages naming made-up holders must not grow it.
const maxFeeds = 2 * maxMembers

// forgetAfter is how long a number heard above a holder's watermark
// counts: a holder stores the number of each publish at its next
// heartbeat, within a cycle and a Redis call, so one still above it two
// cycles and two calls later was never its (anyone's write, without a
// secret), and must not hide what it does publish.
func (b bounds) forgetAfter() time.Duration { return 2*b.cycle + 2*MaxCallTimeout }

// heardMessage notes the number of a published status dropped as not
// newer than the one applied, once vetted as every status is: a status
// refused does not count as heard.
func (c *Coordinator) heardMessage(key string, v int64, b []byte) {
	if st, err := c.vet(key, v, b); err == nil {
		c.mu.Lock()
		c.heardStatus(st)
		c.mu.Unlock()
	}
}

// heardStatus notes the number of st, a status vetted, published or
// read in a read of every status (which reads whatever its holder
// published before). c.mu is held.
func (c *Coordinator) heardStatus(st status) {
	if st.Seq != 0 {
		c.heard(st.Holder, st.Seq)
	}
}

// heard notes that holder's publish number seq arrived. c.mu is held.
func (c *Coordinator) heard(holder string, seq uint64) {
	if holder == c.Token() {
		return
	}
	f := c.feeds[holder]
	if f == nil {
		if !c.members[holder] && len(c.feeds) >= maxFeeds {
			return
		}
		f = &feed{}
		c.feeds[holder] = f
	}
	if seq > f.got {
		f.got, f.gotAt = seq, time.Now()
	}
	c.reached(f)
}

// reached drops the watermarks of f that what was heard reaches, and
// ends its gap when what was heard reaches the watermark its read must:
// late, not lost. c.mu is held.
func (c *Coordinator) reached(f *feed) {
	n := 0
	for n < len(f.due) && f.due[n].mark <= f.got {
		c.confirm(f, f.due[n].at)
		n++
	}
	f.due = f.due[n:]
	if f.pending != 0 && f.got >= f.pending {
		f.pending = 0
		c.signal()
	}
}

// noteMarks applies the live members' watermarks a heartbeat read, and
// reports whether a gap was found (see feed). When fresh, nothing is found
// missing: after a return every status stored before it is distrusted
// until read again once rewritten, and that read finds whatever was
// published meanwhile; after a subscription read every stored status,
// what was published before it is in what it read, and what was
// published since comes as messages (a member whose watermark is missing
// or refused this time has its next one count so). Feeds of holders that
// are neither live nor heard of for longer than a status stays trusted
// without confirmation are dropped. c.mu is held.
func (c *Coordinator) noteMarks(m Membership, fresh bool) (gap bool) {
	now, at := time.Now(), m.Now.UnixMicro()
	me := c.Token()
	for _, tok := range m.Members {
		if tok == me {
			continue
		}
		f := c.feeds[tok]
		if f == nil {
			f = &feed{}
			c.feeds[tok] = f
		}
		f.seen = now
		f.fresh = f.fresh || fresh
		w, ok := m.Watermarks[tok]
		if !ok {
			// None stored (an instance that numbers nothing), or lost
			// (anyone's write, gone at its next heartbeat): nothing to
			// confirm or find missing this time.
			continue
		}
		f.numbers = true
		if f.fresh {
			if at < f.confirmed {
				c.forgetCovers() // confirmed earlier than before: Redis's clock went back
			}
			f.got, f.due, f.pending, f.confirmed, f.fresh = max(f.got, w), nil, 0, at, false
			continue
		}
		if f.got > w && now.Sub(f.gotAt) > c.b.forgetAfter() {
			f.got = w
		}
		c.reached(f)
		switch {
		case w <= f.got:
			c.confirm(f, at) // nothing it published is missing here
		case len(f.due) < maxDue && (len(f.due) == 0 || w > f.due[len(f.due)-1].mark):
			f.due = append(f.due, due{mark: w, read: now, at: at})
		}
		if f.pending == 0 && len(f.due) > 0 && now.Sub(f.due[0].read) > c.b.gapAfter() && c.sub.CaughtUp().After(f.due[0].read) {
			f.pending, f.gapAt, gap = f.due[len(f.due)-1].mark, now, true
			c.forgetCovers() // its statuses lapse a handoff on (see asOf)
			c.rlog.Logf("gap", "a publish of member %s was not heard here within %v (its watermark %d, heard %d): reading its statuses again", tok, c.b.gapAfter(), f.due[0].mark, f.got)
		}
	}
	for tok, f := range c.feeds {
		if !c.members[tok] && now.Sub(f.seen) > c.b.cover() && now.Sub(f.gotAt) > c.b.cover() {
			delete(c.feeds, tok)
			c.forgetCovers()
		}
	}
	return gap
}

// asOf returns when r, a status applied here, was last known to be its
// holder's current one (Redis's clock, µs): its version, or the last
// confirmation of its holder's feed when later (a status nothing replaced
// is current as long as nothing its holder published is missing here);
// and whether a gap found in its holder's publishes has outlasted the
// handoff without being repaired (see feed): its statuses then cover
// nothing until read again. A holder that numbers nothing has its
// statuses read again every legacyResync: they are as current as their
// version. c.mu is held.
func (c *Coordinator) asOf(r *remoteStatus) (at int64, lapsed bool) {
	f := c.feeds[r.Holder]
	if f == nil || !f.numbers {
		return r.version, false
	}
	return max(r.version, f.confirmed), f.pending != 0 && time.Since(f.gapAt) > c.b.handoff()
}

// marks returns the holders' watermarks a read of every status beginning
// now reaches: those of the last heartbeat (whatever they published
// before the read is stored, and read by it). c.mu is held.
func (c *Coordinator) marks() map[string]uint64 {
	out := make(map[string]uint64, len(c.feeds))
	for tok, f := range c.feeds {
		if f.numbers {
			out[tok] = max(f.pending, f.got)
			if len(f.due) > 0 {
				out[tok] = max(out[tok], f.due[len(f.due)-1].mark)
			}
		}
	}
	return out
}

// readPast notes a read j that completed: each holder of its marks has
// been read past its mark, and what is known of its statuses was current
// at its start. A read of every status begun after the last subscription
// also covers what was published while that subscription was being made
// (see beforeResync): confirmations resume, and the next heartbeat's
// watermarks count as reached, since what was published between the last
// heartbeat and the subscription is in what it read, and never comes as a
// message.
func (c *Coordinator) readPast(j readJob) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for tok, mark := range j.marks {
		f := c.feeds[tok]
		if f == nil {
			continue
		}
		f.got = max(f.got, mark)
		c.reached(f)
		f.confirmed = max(f.confirmed, j.at)
	}
	if j.all && j.gen == c.subGen && c.subPending {
		c.subPending, c.subscribed = false, true
	}
	c.signal()
}

// confirm notes that what is known of f's statuses was current at at
// (Redis's clock, µs), unless a subscription was made since the last read
// of every status: whatever its holder published while it was being made
// came as no message, and is known only once a read of every status
// begun after it completes (see readPast). c.mu is held.
func (c *Coordinator) confirm(f *feed, at int64) {
	if !c.subPending {
		f.confirmed = max(f.confirmed, at)
	}
}

// beforeResync is asked before the subscription reads every stored
// status, at each subscription, and makes it skip that read: the read is
// one of reads' instead (see nextRead), paced and tried again until it
// completes, so that the subscription's loop goes on delivering messages
// meanwhile. (Read in that loop, on a loaded machine, messages waited
// behind it until Redis closed the subscription at its output-buffer
// limit, and the read made at the next one waited again.) Until the read
// completes, nothing of any holder is confirmed (see confirm). In local
// mode, or after a return, the read after the return serves (see reads).
func (c *Coordinator) beforeResync() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	// A subscription made again may follow a Redis that lost what it
	// stored (a restart, a fail-over to a replica behind): each status
	// this instance holds is written again at its next probe, not a
	// rewrite period on (see quiet), so that a lost lease is found by
	// that write and a lost status stored and published again.
	for k, kl := range c.kept {
		kl.stored = time.Time{}
		c.kept[k] = kl
	}
	c.subGen++
	c.subPending, c.subscribed = true, false
	if c.mode != ModeCoordinated || !c.resyncAt.IsZero() {
		c.subReadAt = time.Time{}
		c.syncOnce.Do(func() { close(c.synced) })
		return false
	}
	c.subReadAt = time.Now()
	c.signalRead()
	return false
}
