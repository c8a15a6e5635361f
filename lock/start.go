package lock

import (
	"context"
	"hash/fnv"
	"math"
	"sync"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// Run coordinates until ctx is done, calling apply with each new View.
//
// It joins the fleet (a heartbeat, taking no lease yet: see join),
// subscribes and reads the fleet's statuses (a cold start answers from
// them), then takes its leases a cycle after its start and its stagger
// (see stagger) later: a fleet started at once (a new Deployment rolled
// out) has its members first, then their leases, spread over a cycle, each
// probed at once by its new holder, rather than every instance taking and
// probing every target before it knows the others. Until then, and for a
// handoff after each change of owner, a target the fleet gives to another
// live member is left to it (see deferred).
//
// apply is called once before Run's first wait, whether Redis answered or
// not, so that an instance never answers before it knows what the fleet
// knows (see awaitChecked). When Run returns, this instance's leases are
// released and its membership ended (when Redis answers), so that others
// take over at once.
func (c *Coordinator) Run(ctx context.Context, apply func(health.View)) {
	start := time.Now()
	c.mu.Lock()
	c.takeFrom = start.Add(c.b.cycle + c.stagger())
	takeFrom := c.takeFrom
	c.mu.Unlock()
	c.join(ctx)
	c.mu.Lock()
	// The first read of every status as a safety net comes at a point
	// of its period this instance's token gives it: a fleet started
	// together reads spread over it.
	every := c.b.safetyEvery(len(c.memberList))
	c.safetyAt = start.Add(every/2 + time.Duration(float64(every/2)*float64(c.stagger())/float64(c.b.cycle)))
	c.mu.Unlock()

	var wg sync.WaitGroup
	wg.Go(func() {
		// Subscribe returns only when ctx is done (or go-redis closed the
		// subscription, which it does not while the client is open).
		for ctx.Err() == nil {
			if err := c.sub.Subscribe(ctx, func(k string, v int64, b []byte) { c.applyRemote(k, v, b, false) }); err != nil && ctx.Err() == nil {
				c.logf("%v", err)
			}
		}
	})
	wg.Go(func() { c.reads(ctx) })
	wg.Go(func() { c.rechecksLoop(ctx) })
	wg.Go(func() {
		if sleep(ctx, time.Until(takeFrom)) != nil {
			return
		}
		c.tendLoop(ctx)
	})
	c.awaitSynced(ctx)
	if !c.cfg.Passive {
		// A passive instance answers from what the fleet knows now: it
		// probes nothing to wait for.
		c.awaitChecked(ctx)
	}
	var views pacer
	// The entries of targets this instance probed and does not hold
	// change by time alone too (a holder's status comes to cover one, or
	// stops: see ownLapse), with nothing to wake the loop: a View is made
	// again when that may have happened, or an instance that stopped
	// probing a target its holder now covers would answer its own
	// unfinished verdict (none) for as long as nothing else changed.
	due := time.NewTimer(time.Hour)
	defer due.Stop()
	var last health.View
	first := true
	view := func() {
		start := time.Now()
		// A View that changed nothing (its due entries made again to the
		// same verdicts) is not applied again: the zone it makes is the
		// one served.
		if v := c.view(); first || !v.Same(last) {
			first, last = false, v
			apply(v)
		}
		views.ran(start)
		if d, ok := c.untilOwnDue(); ok {
			due.Reset(d)
		} else {
			due.Stop()
		}
	}
	view()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			c.endWrites()
			c.leave()
			return
		case <-c.wake:
		case <-due.C:
		}
		// Paced: one View covers every change since the last.
		if views.wait(ctx) == nil {
			view()
		}
	}
}

// untilOwnDue is how long until the entries of keys in own not held may
// change by time alone (see ownLapse), and whether any may. Rounded up to
// the next millisecond: a View made a moment before would find nothing
// due, and set the same moment again.
func (c *Coordinator) untilOwnDue() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at := c.ownDues.nextDue()
	if at == math.MaxInt64 {
		return 0, false
	}
	return max(time.Duration(at-c.now())*time.Microsecond, 0) + time.Millisecond, true
}

// tendLoop runs tend once a cycle, and in local mode once a step (see
// bounds.step): there its heartbeat is the probe that tells Redis is back,
// and until it does this instance probes every target itself, so a
// fleet whose Redis returns is back to one prober per target within a
// step and a call of it, not within a cycle.
func (c *Coordinator) tendLoop(ctx context.Context) {
	step := c.b.step()
	t := time.NewTicker(step)
	defer t.Stop()
	last := time.Now()
	c.tend(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if c.Mode() != ModeLocal && now.Sub(last) < c.b.cycle-step/2 {
				continue
			}
			last = now
			c.tend(ctx)
		}
	}
}

// join is Run's first round: a heartbeat, taking no lease yet. A Redis
// that misses its deadlines at the start (a fleet started at once loads
// it, and the machines it runs on) is given as long as a coordinating
// instance gives it before it goes local (bounds.outageAfter, see failed),
// a heartbeat every half cycle: an instance of a fleet started together
// that went local at its first missed deadline would probe every target,
// which loads the others' Redis calls the more, and so on. Each failure
// counts as a coordinating instance's does, so that local mode, when it
// comes, names what is wrong (see noteCause), not only the last deadline.
func (c *Coordinator) join(ctx context.Context) {
	for {
		start := time.Now()
		m, err := c.heartbeat(ctx)
		if err == nil {
			if c.round(m).read {
				c.signalRead()
			}
			return
		}
		c.lost(ctx, start, err)
		if ctx.Err() != nil || c.Mode() == ModeLocal || sleep(ctx, c.b.cycle/2) != nil {
			return
		}
	}
}

// stagger is this instance's offset within a cycle, drawn from its token:
// instances started together take their leases, and read every status
// after a return, spread over a cycle.
func (c *Coordinator) stagger() time.Duration {
	h := fnv.New64a()
	h.Write([]byte(c.Token()))
	return time.Duration(h.Sum64() % uint64(max(c.b.cycle, 1)))
}

// Bounds of the waits before the first View (awaitSynced, awaitChecked).
const (
	// firstTargetsWait bounds the wait for the registry's nodes: the
	// registry's own start-up wait.
	firstTargetsWait = 5 * time.Second
	// firstReadWait bounds the wait for the subscription's first read
	// of every stored status: a subscription, a SCAN step and a read
	// step, each up to the longest a Redis call may take.
	firstReadWait = 3 * MaxCallTimeout
)

// awaitSynced waits, in coordinated mode, until the subscription has
// read every stored status once (or could not), at most firstReadWait.
func (c *Coordinator) awaitSynced(ctx context.Context) {
	if c.Mode() != ModeCoordinated {
		return
	}
	t := time.NewTimer(firstReadWait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	case <-c.synced:
	}
}

// deferred reports whether key is left to its owner for now rather than
// probed here: before Run's first heartbeat answered or failed for good
// (whether this instance coordinates is not known yet: a fleet started
// together must not probe everything meanwhile), when the owner is this
// instance and its first takes are to come (they probe what they take),
// or when the owner is another live member the key went to less than a
// handoff ago, which takes its lease at its next round and probes it at
// once. So a member that comes or goes moves the probes of its share to
// their new owners, not to every instance at once. A key left to a member
// that never writes it (one anyone added, without a secret) is probed
// here once the handoff is over. c.mu is held.
func (c *Coordinator) deferred(key string) bool {
	switch c.mode {
	case "":
		return true
	case ModeLocal:
		return false
	}
	if o, ok := c.returnOwners[key]; ok && o != c.Token() && time.Now().Before(c.returnUntil) && !c.turning(key) {
		// After a return, left to the member that held it before the
		// outage until its status comes, or the handoff ends (see plan).
		// One whose verdict here was turning (a rise or a fall begun in
		// local mode) is probed on until that status comes: its last
		// verdict here is about to be wrong.
		return true
	}
	switch o := c.owners[key]; {
	case o == c.Token():
		// At a start, until its first round of takes has ended (they
		// probe what they take); after a return, this instance goes on
		// probing its share at its ticks until it takes the leases
		// again.
		return !c.tookFirst && c.joinedAt == 0
	case !c.members[o]:
		return false
	}
	until, ok := c.handoffs[key]
	return ok && time.Now().Before(until)
}

// turning reports whether this instance's own verdict of key is between
// two states: successes counted towards a rise, or failures towards a
// fall. c.mu is held.
func (c *Coordinator) turning(key string) bool {
	p, ok := c.own[key]
	return ok && (p.Verdict.State == health.Up && p.Fail > 0 || p.Verdict.State != health.Up && p.OK > 0)
}

// dropHandoffs forgets the handoffs that are over, and those of keys that
// are no targets. c.mu is held.
func (c *Coordinator) dropHandoffs() {
	now := time.Now()
	for k, until := range c.handoffs {
		if _, ok := c.targets[k]; !ok || !now.Before(until) {
			delete(c.handoffs, k)
		}
	}
}

// awaitChecked waits, before the first View, until every target is
// covered by a live holder's status or has been probed here once, so that
// an instance never answers, even for its first milliseconds, a node that
// nobody vouches for: a stopped backend whose old status someone stored
// again, say. In coordinated mode the targets left to their owners (see
// deferred) are waited for, this instance's own share is probed once its
// leases are taken, and the others it must probe (whose owner did not
// write them within the handoff) are probed at once; in local mode their
// first probes come as the checker spreads them, within an interval. The
// wait ends after the targets' first probes could have ended (the first
// takes, a handoff, an interval and a timeout after the targets came), or
// firstTargetsWait without targets.
func (c *Coordinator) awaitChecked(ctx context.Context) {
	timer := time.NewTimer(firstTargetsWait)
	defer timer.Stop()
	look := time.NewTicker(max(c.b.cycle/2, time.Millisecond)) // a handoff may end
	defer look.Stop()
	known := false
	kicked := map[string]bool{}
	var scans pacer
	for {
		// Paced: each scan passes over every target, and statuses heard
		// wake it one by one.
		if scans.wait(ctx) != nil {
			return
		}
		start := time.Now()
		c.mu.Lock()
		set := c.targetsSet
		kick, wait := c.unchecked()
		mode, probeNow, takeFrom := c.mode, c.probeNow, c.takeFrom
		c.mu.Unlock()
		scans.ran(start)
		if set && len(kick) == 0 && len(wait) == 0 {
			return
		}
		if set && !known {
			known = true
			timer.Reset(max(time.Until(takeFrom), 0) + c.b.handoff() + c.b.interval + c.b.timeout)
		}
		if set && mode == ModeCoordinated {
			for _, k := range kick {
				if !kicked[k] {
					kicked[k] = true
					probeNow(k)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
			return
		case <-look.C:
		case <-c.wake:
		}
	}
}

// unchecked returns the targets not covered by a live holder's status
// that this instance has not probed yet: those it probes now and does not
// hold (to probe at once: the ones it holds are probed as it takes them),
// and the others (its leases to take, or left to their owners). c.mu is
// held.
func (c *Coordinator) unchecked() (kick, wait []string) {
	for k, addr := range c.targets {
		if _, ok := c.own[k]; ok {
			continue
		}
		probe, covered := c.probes(k, addr)
		switch {
		case probe && !c.held[k]:
			kick = append(kick, k)
		case probe || !covered:
			wait = append(wait, k)
		}
	}
	return kick, wait
}

// endWrites stops new status writes, cuts short those in flight, and waits
// for them, so that none outlives Run.
func (c *Coordinator) endWrites() {
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	c.stopWrites()
	c.writes.Wait()
}
