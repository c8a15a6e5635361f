package lock

import (
	"context"
	"hash/fnv"
	"sync"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// Run coordinates until ctx is done, calling apply with each new View. It
// joins the fleet, subscribes and reads the fleet's statuses (a cold start
// answers from them): apply is called once before Run's first wait,
// whether Redis answered or not, so that an instance never answers before
// it knows what the fleet knows (see awaitChecked). When Run returns, this
// instance's leases are released and its membership ended (when Redis
// answers), so that others take over at once.
func (c *Coordinator) Run(ctx context.Context, apply func(health.View)) {
	start := time.Now()
	c.tend(ctx)
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
	wg.Go(func() { c.everyCycle(ctx, nil, func() { c.tend(ctx) }) })
	c.awaitSynced(ctx)
	c.awaitChecked(ctx)
	apply(c.view())
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			c.endWrites()
			c.leave()
			return
		case <-c.wake:
			apply(c.view())
		}
	}
}

// stagger is this instance's offset within a cycle, drawn from its token:
// instances started together read every status, and after a return,
// spread over a cycle.
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

// awaitChecked waits, before the first View, until every target this
// instance must probe itself (no live holder's status covers it) has been
// probed once, so that an instance never answers, even for its first
// milliseconds, a node that nobody vouches for: a stopped backend whose
// old status someone stored again, say. In coordinated mode those targets
// are probed at once (they are few: the ones whose holder is gone, and
// this instance's share); in local mode their first probes come as the
// checker spreads them, within an interval. The wait ends after the
// targets' first probes could have ended (interval and timeout after the
// targets came), or firstTargetsWait without targets.
func (c *Coordinator) awaitChecked(ctx context.Context) {
	timer := time.NewTimer(firstTargetsWait)
	defer timer.Stop()
	kicked := false
	for {
		c.mu.Lock()
		set, pending := c.targetsSet, c.unchecked()
		mode, probeNow := c.mode, c.probeNow
		c.mu.Unlock()
		if set && len(pending) == 0 {
			return
		}
		if set && !kicked {
			kicked = true
			timer.Reset(c.b.interval + c.b.timeout)
			if mode == ModeCoordinated {
				for _, k := range pending {
					probeNow(k)
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
			return
		case <-c.wake:
		}
	}
}

// unchecked returns the targets this instance probes and has not probed
// yet. c.mu is held.
func (c *Coordinator) unchecked() []string {
	var out []string
	for k, addr := range c.targets {
		if _, ok := c.own[k]; !ok && c.probes(k, addr) {
			out = append(out, k)
		}
	}
	return out
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
