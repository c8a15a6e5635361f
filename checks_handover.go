package pgcluster

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/lock"
)

// handovers holds, by handoverKey, the verdicts the instance of each
// pgcluster block last published, so that the instance a Corefile reload
// starts in its place answers with them at once, alongside the rows it
// restores. Without them it would answer SERVFAIL until its first verdicts
// (with redis, until Redis has been asked, which a frozen Redis makes last
// a call timeout) or, without redis, judge every node as not checked yet
// and answer backends that are down.
var handovers = struct {
	sync.Mutex
	m map[string]*handover
}{m: map[string]*handover{}}

// handoverKey names what a successor may take over: the rows it restores
// (registry DSN and zones) checked the same way.
func handoverKey(cfg *settings) string {
	return storeKey(cfg.dsn, cfg.zones) + "\x00" + cfg.check + "\x00" + cfg.checkOptions
}

// handover stands between an instance's checks and its publisher. It
// passes each View on, filled in, for the nodes the View does not judge
// yet, with the verdicts the instance before this one published (while
// the node's address is the same), until this instance's own checks
// could have judged every node; and it keeps what it published for the
// instance after this one.
type handover struct {
	key string // of handovers
	// ctx and publish are set by start, before any View is passed on.
	ctx     context.Context
	publish func(health.View)
	// carrying is set while carried may hold verdicts: read without mu.
	carrying atomic.Bool

	mu      sync.Mutex               // serialises publish; guards what follows
	carried map[string]handedVerdict // the predecessor's, until replaced or expired
	last    health.View              // this instance's own, as last set
	// What was published last, for a successor (see handed): the View,
	// the addresses of the nodes checked then, and the carried verdicts
	// it held with theirs. Kept as they are and made into handed
	// verdicts only when a successor asks: a View comes with every
	// change the fleet publishes, and copying each one (a thousand
	// nodes, a fleet started together) was CPU taken from the machine
	// that runs the fleet's Redis.
	shownView    health.View
	shownTargets map[string]netip.AddrPort
	shownCarried map[string]handedVerdict

	tmu     sync.Mutex // guards targets; never held while publishing
	targets map[string]netip.AddrPort
}

// handedVerdict is a verdict and the address it was made for.
type handedVerdict struct {
	addr netip.AddrPort
	v    health.Verdict
}

// carryFor is how long a predecessor's verdicts may stand in: long enough
// for this instance's checks to judge every node (a Redis call that times
// out, a first probe up to an interval late, rise or fall probes an
// interval apart, the last one's timeout), with an interval to spare.
func carryFor(cfg *settings) time.Duration {
	return lock.CallTimeout + time.Duration(max(cfg.rise, cfg.fall)+2)*cfg.interval + cfg.timeout
}

// newHandover makes the handover of the instance under key, not started:
// it records the nodes checked (setTargets) until start.
func newHandover(key string) *handover {
	return &handover{key: key, targets: map[string]netip.AddrPort{}}
}

// start registers the instance under h's key, takes what the instance it
// replaces published, and from then on passes Views on to publish. When
// there was one, publish has been called with its verdicts before start
// returns. The carried verdicts lapse after carry, or when ctx is done,
// which also unregisters the instance unless a successor took its place.
func (h *handover) start(ctx context.Context, publish func(health.View), carry time.Duration) {
	h.mu.Lock()
	h.ctx, h.publish = ctx, publish
	h.mu.Unlock()
	key := h.key
	handovers.Lock()
	prev := handovers.m[key]
	handovers.m[key] = h
	handovers.Unlock()
	if prev != nil {
		prev.mu.Lock()
		h.carried = prev.handed()
		prev.mu.Unlock()
	}
	context.AfterFunc(ctx, func() {
		handovers.Lock()
		if handovers.m[key] == h {
			delete(handovers.m, key)
		}
		handovers.Unlock()
	})
	if len(h.carried) == 0 {
		h.carried = nil
		return
	}
	h.carrying.Store(true)
	h.mu.Lock()
	h.publishLocked(health.View{})
	h.mu.Unlock()
	t := time.AfterFunc(carry, h.lapse)
	context.AfterFunc(ctx, func() { t.Stop() })
}

// setTargets records the address of each node checked, so that a carried
// verdict stands only for the address it was made for. While verdicts are
// carried, the View is published again with the new addresses (the
// publisher calls its sink with its own lock released).
func (h *handover) setTargets(ts []health.Target) {
	addrs := make(map[string]netip.AddrPort, len(ts))
	for _, t := range ts {
		addrs[t.Key] = t.Addr
	}
	h.tmu.Lock()
	h.targets = addrs
	h.tmu.Unlock()
	if h.carrying.Load() {
		h.refresh(false)
	}
}

// setView passes v, this instance's own verdicts, on.
func (h *handover) setView(v health.View) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = v
	h.publishLocked(v)
}

// lapse drops the carried verdicts and publishes this instance's own
// alone.
func (h *handover) lapse() { h.refresh(true) }

// refresh publishes this instance's last View again, filled in with the
// carried verdicts that still stand (none when drop), while verdicts are
// carried and ctx is not done.
func (h *handover) refresh(drop bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.carried == nil || h.ctx.Err() != nil {
		return
	}
	if drop {
		h.carried = nil
	}
	h.publishLocked(h.last)
}

// publishLocked publishes v filled in with the carried verdicts of the
// nodes it lacks, and keeps what it published. A carried verdict goes once
// v judges its node. h.mu is held.
func (h *handover) publishLocked(v health.View) {
	h.tmu.Lock()
	targets := h.targets // replaced whole by setTargets, never changed
	h.tmu.Unlock()
	out := v // Views are not changed once made: published as they are
	var shown map[string]handedVerdict
	if h.carried != nil {
		e := v.Edit()
		shown = make(map[string]handedVerdict, len(h.carried))
		for k, c := range h.carried {
			if _, judged := v.Get(k); judged {
				delete(h.carried, k)
				continue
			}
			if a, ok := targets[k]; ok && a != c.addr {
				continue // the node moved: the verdict was not about this address
			}
			e.Set(k, c.v)
			shown[k] = c
		}
		out = e.View()
		if len(h.carried) == 0 {
			h.carried = nil
			h.carrying.Store(false)
		}
	}
	h.shownView, h.shownTargets, h.shownCarried = out, targets, shown
	h.publish(out)
}

// handed is what this instance published last, each verdict with the
// address it was made for (a carried one's own address when the node was
// not checked here). h.mu is held.
func (h *handover) handed() map[string]handedVerdict {
	out := make(map[string]handedVerdict, h.shownView.Len())
	for k, verdict := range h.shownView.All() {
		addr, ok := h.shownTargets[k]
		if !ok {
			addr = h.shownCarried[k].addr
		}
		out[k] = handedVerdict{addr: addr, v: verdict}
	}
	return out
}
