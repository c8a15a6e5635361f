package lock

import (
	"container/heap"
	"context"
	"errors"
	"maps"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/printable"
	"github.com/pgcluster/pgcluster/internal/ratelog"
)

// Modes of a Coordinator.
const (
	// ModeCoordinated: Redis answers; each target is probed by the instance
	// holding its lease, and every instance applies the holder's verdicts.
	ModeCoordinated = "coordinated"
	// ModeLocal: Redis does not answer; this instance probes every target.
	ModeLocal = "local"
)

// Defaults of a Coordinator's Config.
const (
	// DefaultResync is how often every stored status is read again, as a
	// safety net: what changes reaches every instance as it is published,
	// and a message lost is found by its holder's watermark (see
	// Coordinator), so this read repairs only what neither could.
	DefaultResync = 5 * time.Minute
	// statusTTL is how long a status no holder writes any more stays
	// stored: long enough to outlive any outage the fleet rides out, short
	// enough that the statuses of removed nodes do not pile up.
	statusTTL = time.Hour
	// statusTTLEvery: a holder rewrites its statuses at least every
	// rewrite period (see bounds.rewrite), and sets their expiry once per
	// this period of their versions, not at every write (one command per
	// write less for Redis to run).
	statusTTLEvery = statusTTL / 4
)

// Config configures a Coordinator.
type Config struct {
	// Prefix starts every key name; no "{" or "}" (the hash tag of Redis
	// Cluster).
	Prefix string
	// Interval and Timeout are the health checks': a lease lasts a few
	// intervals, and leases and membership are looked after every half
	// interval.
	Interval, Timeout time.Duration
	// LeaseTTL is how long a lease lasts without a probe to renew it; 0 is
	// 3 intervals plus the timeout, at least a second.
	LeaseTTL time.Duration
	// Resync is how often every stored status is read again, as a
	// safety net (in a large fleet less often: every two intervals per
	// member, so that the fleet's reads stay under half its status
	// writes); 0 is DefaultResync.
	Resync time.Duration
	// Secret, when set, signs every status written and this instance's
	// membership, and rejects every status and member read without its
	// valid signature.
	Secret []byte
	// WAL: a moved WAL position is news to publish (lag is judged).
	WAL bool
	// Token names this instance in Redis; "" draws a fresh one (see
	// NewToken).
	Token string
	// Name is this instance's host and DNS listener (for example
	// "dns-2:53"), stored beside its membership (signed with Secret) so
	// that tools show its token with the host it names (Fleet's
	// Member.Name); cut to 200 bytes. "" stores none.
	Name string
	// Logf, when set, hears each change of mode and each failure worth a
	// line; those that what is read from Redis can cause, at most one per
	// kind per minute (internal/ratelog).
	Logf func(format string, args ...any)
	// Observer, when set, hears what the metrics count.
	Observer Observer
	// Passive: this instance never probes and holds nothing. It reads the
	// members without joining them (nobody's owner, no lease taken), and
	// its View is the holders' statuses as they last were, whether a
	// live holder still vouches for them or not: while Redis does not
	// answer (ModeLocal), the last ones read. Such an instance runs no
	// checker (Claim would never let one probe).
	Passive bool
	// Segment, when set, names the part of the network whose instances
	// share these checks (a zone or region, each with its own Prefix):
	// it is inside each status's signature, so that a status written in
	// one segment cannot be replayed into another, where the node it
	// judges may not be reachable.
	Segment string
	// QuietModes: this coordinator's changes of mode (Redis answers, or
	// does not) are not logged: another coordinator of the same instance
	// on the same Redis (a passive follower of another segment) says so.
	QuietModes bool
}

// macKey is what a status of key is signed as: the key, and the segment
// when there is one.
func (cfg Config) macKey(key string) string {
	if cfg.Segment == "" {
		return key
	}
	return "segment " + cfg.Segment + "\x00" + key
}

// Observer hears what a Coordinator does. Its methods are called from
// several goroutines and must not block.
type Observer interface {
	Mode(mode string)              // the mode now
	Leases(held int)               // how many leases this instance holds
	Message(result string)         // a status read: "applied", "stale" or "rejected"
	Resync(err error)              // a read of every stored status ended
	Propagation(d time.Duration)   // from a holder's write to its status applied here
	Write(ok bool, published bool) // a status write of ours: fenced in (ok) or out, published or only stored
	Extend(extended, lost int)     // leases extended without a write (see extend), and those Redis no longer had
}

// Coordinator shares the health checks of a set of targets between the
// instances of a fleet through Redis. It is the checker's health.Shared (it
// says which targets this instance probes and hears their results), and
// makes the View every instance answers from: its own verdicts for the
// targets it probes, the holders' for the others.
//
// Each target has a lease; the instance whose token it holds probes it and
// writes its verdict, with the rise/fall counters, fenced by the lease,
// and publishes it in the same step, when it changed; a verdict that did
// not change is written again only every rewrite period (five intervals,
// see bounds.rewrite), the lease extended meanwhile by tend. Leases
// go to instances by rendezvous hashing over the live members, so that
// they spread and move only when members come or go.
//
// What an instance knows of the others' statuses comes from what they
// publish, not from reading every stored status again: each holder
// numbers its publishes, and its membership heartbeat stores the number
// of its last one (its watermark). A holder's statuses cover their
// targets (the others do not probe them) while it is the live member the
// fleet gives them to and nothing it published is missing here: a
// watermark read at a heartbeat and still not reached by the messages
// heard two cycles and a Redis call later (and once this instance's
// subscription has heard back a marker sent after that heartbeat, so
// that a message merely late is not taken for lost) is a gap, and that
// holder's statuses are read again; they keep covering for a handoff
// meanwhile, and cover nothing once that has passed without the read
// (see feed).
// Every stored status is read at each (re)subscription, and again, as a
// safety net, every Resync.
//
// A target whose owner changed stays with its holder, while that is a
// live member, until the new owner takes it over (a member that joins
// takes its keys once it can probe them, however long its start takes):
// the holder goes on probing it and publishes each verdict, which covers
// it for a handover (bounds.handover). A target whose holder left is left
// to its new owner for a handoff (bounds.handoff), then probed here too
// until a holder's status covers it; so is a target whose holder is not a
// live member, or whose status predates this instance's return after an
// outage and was not published since. Instances started together join first,
// read the fleet's statuses, then take their leases staggered over a cycle
// (see Run). While Redis does not answer (its calls have kept failing for
// two cycles, see failed), every target is probed here (ModeLocal); when it
// answers again, leases are taken again after a cycle and the stagger
// without probing them at once (their ticks stay spread), and every status
// is read again once its holder has rewritten it.
type Coordinator struct {
	cfg    Config
	b      bounds
	leases *Leases
	sub    *Subscriber
	rlog   *ratelog.Limiter // lines that what is read from Redis causes

	probeNow     func(key string)
	probeAtPhase func(key string)

	mu           sync.Mutex
	mode         string
	targets      map[string]netip.AddrPort
	keyOf        map[string]string // each target's key, as SetTargets gave it (see intern)
	tokens       map[string]string // each live member's token, as memberList holds it (see intern)
	targetsSet   bool              // SetTargets was called (the registry's nodes are known, maybe none)
	held         map[string]bool
	remote       map[string]*remoteStatus // never changed in place: a status applied is a new one
	own          map[string]health.Progress
	published    map[string]health.Progress // what we last published per key
	writtenBy    map[string]bool            // we have written this key's status since taking its lease
	kept         map[string]keptLease       // the leases we hold: when extended, their statuses written (see extend)
	blocked      map[string]time.Time       // when our take of a key that is ours first failed
	seized       map[string]time.Time       // when we last seized a key's lease (see blockedFor)
	members      map[string]bool            // live members' tokens
	memberList   []string                   // the same, in token order
	rank         ranking                    // memberList, for rendezvous hashing
	owners       map[string]string          // each target's owner among memberList (see setOwners)
	top          map[string]uint64          // each target's score against its owner (see ownership.next)
	mine         []string                   // the targets whose owner is this instance, as owners says
	covers       map[string]coverMemo       // what covered found of each key, while nothing it turns on changed (see coverMemo)
	coverGen     uint64                     // the generation of covers that counts: raised by forgetCovers
	offset       time.Duration              // Redis's clock minus ours, at the last heartbeat
	joinedAt     int64                      // Redis µs when we last came back after an outage
	localAt      int64                      // Redis µs, as known here, when we last went local: statuses written before are not trusted (see covered)
	localCover   map[string]localCover      // in local mode, the others' statuses that still cover their keys until (see goLocal)
	failingSince time.Time                  // when the first failure of the current failure streak came (see failed)
	answeredAt   time.Time                  // when Redis last answered a call of ours (see failed)
	cause        error                      // what is wrong, of the current failure streak's errors (see noteCause)
	causeTold    bool                       // cause, not only a deadline, was logged since local mode began
	resyncAt     time.Time                  // a read of every status is due (after a return)
	rereadAt     time.Time                  // and another, once every quiet status was rewritten (see plan)
	safetyAt     time.Time                  // the next read of every status as a safety net
	feeds        map[string]*feed           // what each holder published and what was heard of it
	vetted       vettedMessage              // see vettedMessage
	subReadAt    time.Time                  // a read of every status is due for the subscription made (again) (see beforeResync)
	subGen       uint64                     // raised at each subscription: a read begun before one does not cover it
	subPending   bool                       // no read of every status completed since the last subscription: nothing is confirmed (see confirm)
	subscribed   bool                       // a read of every status completed since the subscription and the last heartbeat (see readPast)
	handoffs     map[string]time.Time       // targets whose owner changed: left to it until then (see deferred)
	returnOwners map[string]string          // after a return, until returnUntil: each target's owner before the outage (see deferred)
	returnUntil  time.Time                  // the end of a return's handoff (see plan)
	takeFrom     time.Time                  // no lease is taken before (see Run and plan)
	tookFirst    bool                       // a round of takes ended since the start (see deferred)
	quietUntil   time.Time                  // leases taken before are not probed at once (a return: see plan)
	wake         chan struct{}
	dirty        map[string]struct{} // keys whose View entry may have changed since the last View (see view)
	dirtyAll     bool                // any entry may have: the next View is made whole
	ownAll       bool                // the entry of any key in own may have (see signal)
	ownDues      ownDues             // the keys of own not held, by when their entries may change by time alone (see view)
	lastView     health.View         // the last View made (when lastMade), shared with Run's apply
	lastMade     bool
	readWake     chan struct{}        // tells reads there may be something to read
	synced       chan struct{}        // closed once the first subscription read every stored status, or did not
	syncOnce     sync.Once            // closes synced
	gapReads     atomic.Int64         // reads of holders' statuses after a gap
	extensions   atomic.Int64         // PEXPIREs sent to extend leases between writes (see extend)
	writing      map[string]*keyWrite // keys with a status write in flight (see Record)
	closing      bool                 // Run is ending: no more writes start
	writes       sync.WaitGroup       // the writes in flight
	writeCtx     context.Context      // the writes' context, cancelled as Run ends
	stopWrites   context.CancelFunc

	// The keys whose ticks the checker put off until their coverMemo
	// lapses (see ClaimParked); the parked keys whose memo was dropped
	// since, or that every one was, for the loop that tells the checker
	// (see rechecksLoop), and what tells it.
	parked      map[string]struct{}
	rechecks    []string
	recheckAll  bool
	recheckWake chan struct{}
	recheck     func(key string)
	recheckAllF func()

	// rereads: keys whose stored status a read found too old to count
	// but newer than the one applied here, to read again then (see
	// applyRemote).
	rereads map[string]time.Time
}

// remoteStatus is the latest status applied for a key.
type remoteStatus struct {
	version int64
	status
}

// NewCoordinator returns a Coordinator of a new instance on rdb.
func NewCoordinator(rdb redis.UniversalClient, cfg Config) (*Coordinator, error) {
	b, err := cfg.bounds()
	if err != nil {
		return nil, err
	}
	cfg.Resync = b.resync
	l, err := leasesOf(rdb, cfg.Prefix, cfg.Token)
	if err != nil {
		return nil, err
	}
	l.secret, l.name = cfg.Secret, printable.Cut(cfg.Name, maxMemberName)
	l.lat.most = b.callTimeout()
	sub, err := NewSubscriber(rdb, cfg.Prefix, cfg.Resync)
	if err != nil {
		return nil, err
	}
	sub.resync = 0 // no timer: reads follows the Coordinator's own rules
	c := &Coordinator{
		cfg: cfg, b: b, leases: l, sub: sub, rlog: ratelog.New(cfg.Logf, 0),
		probeNow:     func(string) {},
		probeAtPhase: func(string) {},
		targets:      map[string]netip.AddrPort{},
		held:         map[string]bool{},
		remote:       map[string]*remoteStatus{},
		covers:       map[string]coverMemo{},
		parked:       map[string]struct{}{},
		rereads:      map[string]time.Time{},
		recheckWake:  make(chan struct{}, 1),
		coverGen:     1,
		own:          map[string]health.Progress{},
		published:    map[string]health.Progress{},
		writtenBy:    map[string]bool{},
		kept:         map[string]keptLease{},
		blocked:      map[string]time.Time{},
		seized:       map[string]time.Time{},
		members:      map[string]bool{},
		owners:       map[string]string{},
		feeds:        map[string]*feed{},
		handoffs:     map[string]time.Time{},
		wake:         make(chan struct{}, 1),
		dirty:        map[string]struct{}{},
		readWake:     make(chan struct{}, 1),
		synced:       make(chan struct{}),
		writing:      map[string]*keyWrite{},
	}
	c.writeCtx, c.stopWrites = context.WithCancel(context.Background())
	sub.OnError = func(err error) { c.rlog.Logf("subscription", "%v", err) }
	sub.OnReject = c.rejected
	sub.OnStale = func(string) { c.observe(func(o Observer) { o.Message("stale") }) }
	sub.BeforeResync = c.beforeResync
	sub.Heard = c.heardMessage
	sub.Horizon = c.horizon
	// A status is vetted before its version counts: one refused is
	// dropped without raising the key's last version, so that a forged
	// or replayed status, whatever its version, cannot make the real
	// ones stale. One that passes counts as heard of its holder (see
	// feed), whether its key is wanted here or not. It is vetted once
	// (its MAC is the costliest part of a message), and applied from
	// what vetting read: a fleet's start publishes tens of thousands of
	// statuses a second to every instance.
	sub.Accept = func(key string, v int64, b []byte) bool {
		st, err := c.vet(key, v, b)
		if err != nil {
			c.refused(key, st, err)
			return false
		}
		c.mu.Lock()
		c.heardStatus(st)
		ok := c.wanted(key)
		c.mu.Unlock()
		if ok {
			c.vetted = vettedMessage{key: key, v: v, st: st}
		}
		return ok
	}
	sub.Live = func(key string, v int64, b []byte) {
		if m := c.vetted; m.key == key && m.v == v {
			c.vetted = vettedMessage{}
			c.applyVetted(key, v, m.st, true)
			return
		}
		c.applyRemote(key, v, b, true)
	}
	return c, nil
}

// vet vets a status of key read from Redis with version, as every reader
// of the fleet does (vetStatus), by Redis's clock as this instance knows
// it.
func (c *Coordinator) vet(key string, v int64, b []byte) (status, error) {
	return vetStatus(c.cfg.macKey(key), v, b, c.cfg.Secret, c.redisNow(), c.b.ttl)
}

// rejected counts and logs, at most once per kind per minute, a status
// refused.
func (c *Coordinator) rejected(key string, err error) {
	c.observe(func(o Observer) { o.Message("rejected") })
	c.rlog.Logf("status "+refusalKind(err), "status of %s dropped: %v", quoteRedis(key), err)
}

// refused counts a status vetting refused (st, as far as it was read): as
// stale when it is a status of key come back with another version than
// its own (its signature holds, not its version) and its own version is
// not above the one applied, an older status replayed; as rejected
// otherwise.
func (c *Coordinator) refused(key string, st status, err error) {
	if refusalKind(err) == refusedVersion {
		c.mu.Lock()
		r, had := c.known(key)
		c.mu.Unlock()
		if had && st.V <= r.version {
			c.observe(func(o Observer) { o.Message("stale") })
			c.rlog.Logf("status replayed", "status of %s dropped: an older status, version %d, replayed under another version", quoteRedis(key), st.V)
			return
		}
	}
	c.rejected(key, err)
}

// wanted reports whether a status of key can count here: key is a
// target, or no target is known yet (a cold start answers from the stored
// statuses the fleet stands by). Statuses of other keys are not kept, so
// that what is published cannot grow this instance's memory; a genuine
// one (a node this instance has not read from the registry yet) is
// published again when it changes, and read again by the next read of
// every status. c.mu is held.
func (c *Coordinator) wanted(key string) bool {
	_, ok := c.targets[key]
	return ok || len(c.targets) == 0
}

// vettedMessage is the last published status Accept vetted and let
// through, which the subscription applies next (see NewCoordinator). The
// subscription's goroutine only.
type vettedMessage struct {
	key string
	v   int64
	st  status
}

// redisNow is Redis's clock as this instance knows it, Unix µs: its own
// plus the offset measured at the last heartbeat.
func (c *Coordinator) redisNow() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now()
}

// now is redisNow with c.mu held.
func (c *Coordinator) now() int64 { return time.Now().Add(c.offset).UnixMicro() }

// horizon is the highest version a genuine status can have now.
func (c *Coordinator) horizon() int64 { return c.redisNow() + c.b.ttl.Microseconds() }

// known returns the status applied for key, unless its version is beyond
// the horizon: versions follow Redis's clock, and one further ahead than
// a lease (Redis's clock stepped back, or a fail-over to a server whose
// clock is behind) must not hold back every later status. c.mu is held.
func (c *Coordinator) known(key string) (*remoteStatus, bool) {
	r, ok := c.remote[key]
	if !ok || r.version > c.now()+c.b.ttl.Microseconds() {
		return nil, false
	}
	return r, true
}

// Token is this instance's token in Redis (its leases' value, its member name).
func (c *Coordinator) Token() string { return c.leases.Token() }

// LeaseTTL is how long a lease lasts without a probe to renew it.
func (c *Coordinator) LeaseTTL() time.Duration { return c.b.ttl }

// SetProbeNow gives the function that probes a target at once (the
// checker's ProbeNow), called when this instance takes a target over.
func (c *Coordinator) SetProbeNow(f func(key string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.probeNow = f
}

// SetProbeAtPhase gives the function that moves a target's probe waiting
// for the probe budget to its phase (the checker's ProbeAtPhase), called
// for the targets this instance takes back when Redis answers again.
func (c *Coordinator) SetProbeAtPhase(f func(key string)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.probeAtPhase = f
}

// SetRecheck gives the functions that bring the parked ticks of a target
// (one) and of every target (all) back within an interval (the checker's
// Recheck and RecheckAll, see health.Parking).
func (c *Coordinator) SetRecheck(one func(key string), all func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recheck, c.recheckAllF = one, all
}

// SetTargets replaces the set of targets, as the checker's SetTargets.
func (c *Coordinator) SetTargets(ts []health.Target) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.targets = make(map[string]netip.AddrPort, len(ts))
	c.keyOf = make(map[string]string, len(ts))
	c.targetsSet = true
	for _, t := range ts {
		c.targets[t.Key] = t.Addr
		c.keyOf[t.Key] = t.Key
	}
	c.setOwners(c.ownership())
	c.forgetCovers()
	// What this instance probed of targets that are gone is of no use;
	// the statuses stay (they expire in Redis, and a target may be back).
	for _, m := range []map[string]health.Progress{c.own, c.published} {
		for k := range m {
			if _, ok := c.targets[k]; !ok {
				delete(m, k)
			}
		}
	}
	for k := range c.writtenBy {
		if _, ok := c.targets[k]; !ok {
			delete(c.writtenBy, k)
		}
	}
	for k := range c.kept {
		if _, ok := c.targets[k]; !ok {
			delete(c.kept, k)
		}
	}
	// Nor are the statuses of keys that are not targets kept: a target
	// that comes back is read again at the next resync.
	if len(c.targets) > 0 {
		for k := range c.remote {
			if _, ok := c.targets[k]; !ok {
				delete(c.remote, k)
				c.forgetCover(k)
			}
		}
	}
	c.signalAll()
}

// Mode returns ModeCoordinated or ModeLocal ("" before Run's first heartbeat).
func (c *Coordinator) Mode() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mode
}

// Members returns how many live members the last read of the fleet found
// (none before the first, and none while Redis does not answer).
func (c *Coordinator) Members() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mode != ModeCoordinated {
		return 0
	}
	return len(c.memberList)
}

// Held returns the keys whose leases this instance holds, sorted.
func (c *Coordinator) Held() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(maps.Keys(c.held))
}

// Claim implements health.Shared: this instance probes t in local mode,
// while it holds t's lease, and while no live holder's status covers t.
func (c *Coordinator) Claim(t health.Target) (bool, health.Progress) {
	probe, seed, _ := c.ClaimParked(t)
	return probe, seed
}

// ClaimParked implements health.Parking: Claim, and when another holder's
// status covers t, until when its coverMemo holds (see covered), or for
// parkFed while it holds by the confirmations of its holder's feed. The
// key is parked meanwhile: whatever drops its memo first (forgetCover,
// forgetMoved, forgetCovers, sweepLapses) has the checker ask again
// within an interval, as it
// asked every interval before, so that a target left to another is asked
// about only when the answer may change. (Every instance of a fleet is
// given about one target in members; the others' Claims were most of its
// steady work.)
func (c *Coordinator) ClaimParked(t health.Target) (bool, health.Progress, time.Time) {
	if c.cfg.Passive {
		return false, health.Progress{}, time.Time{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	probe, seed := c.claim(t)
	if probe {
		return probe, seed, time.Time{}
	}
	// Parked only where something brings the tick back (SetRecheck):
	// a checker nobody tells would leave the target unasked until the
	// memo lapses, whatever changed meanwhile.
	m, ok := c.covers[t.Key]
	if !ok || m.gen != c.coverGen || m.addr != t.Addr || c.mode == ModeLocal || c.recheck == nil || c.recheckAllF == nil {
		return false, seed, time.Time{}
	}
	now := c.now()
	until, byFeed := c.memoUntil(m)
	if time.Duration(until-now)*time.Microsecond < 2*c.b.interval {
		// About to lapse: made again, in case its status is
		// vouched for longer by now (see memoUntil).
		delete(c.covers, t.Key)
		if !c.covered(t.Key, t.Addr) {
			return false, seed, time.Time{}
		}
		if m, ok = c.covers[t.Key]; !ok {
			return false, seed, time.Time{}
		}
		if until, byFeed = c.memoUntil(m); time.Duration(until-now)*time.Microsecond < 2*c.b.interval {
			// Its holder's feed is not confirmed any more: parked
			// until the cover lapses, when the next Claim finds it
			// uncovered.
			byFeed = false
		}
	}
	c.parked[t.Key] = struct{}{}
	if byFeed {
		// Its cover goes on as its holder's feed is confirmed, and a
		// feed that stops being confirmed has every parked key asked
		// about again before its covers lapse (see sweepLapses).
		until = max(until, now+parkFed.Microseconds())
	}
	return false, seed, time.UnixMicro(until).Add(-c.offset)
}

// parkFed is how long, at the least, a target covered by a holder whose
// feed numbers its publishes is parked (see ClaimParked): its cover goes
// on with every confirmation of the feed, and lapses only after the
// sweep has had the checker ask about it again (sweepLapses). A bound
// all the same, so that a cover nothing forgot is asked about again in
// time: at 10,000 targets an instance asked about each one every cover
// (18.5 s at an interval of 2 s), 540 Claims a second, most of the
// steady work of an instance that holds a hundredth of them.
const parkFed = 90 * time.Second

// memoUntil is until when the cover m remembers holds: its until, or,
// when its holder's feed numbers its publishes and has no gap pending,
// a cover after the feed's last confirmation if later. That is when the
// status's asOf would put it now: the status it was made of is still the
// one applied (another forgets it), and a gap found, a feed forgotten or
// confirmed earlier than before forget every cover. c.mu is held.
// It reports too whether that is the feed's: only then does the sweep
// see the cover's lapse coming (see sweepLapses).
func (c *Coordinator) memoUntil(m coverMemo) (until int64, byFeed bool) {
	if !m.fed {
		return m.until, false
	}
	if f := c.feeds[m.holder]; f != nil && f.numbers && f.pending == 0 {
		if fu := f.confirmed + c.b.cover().Microseconds(); fu >= m.until {
			return fu, true
		}
	}
	return m.until, false
}

// memoEnd is when the cover m remembers lapses (see memoUntil). c.mu is held.
func (c *Coordinator) memoEnd(m coverMemo) int64 {
	until, _ := c.memoUntil(m)
	return until
}

// sweepLapses has the checker ask again about every parked target when
// the covers of a holder's feed are about to lapse (no confirmation for
// a cover less two intervals): a target parked for parkFed is asked about
// again before its cover lapses, and probed here if it did. Run every
// cycle: whatever stops the confirmations (a holder that stopped
// publishing its watermark, a subscription made again whose read has not
// completed, heartbeats that fail) is seen within a cycle. Once for each
// confirmation of a feed that lapses. c.mu is held.
func (c *Coordinator) sweepLapses() {
	now := c.now()
	margin := (c.b.cover() - 2*c.b.interval).Microseconds()
	lapsing := false
	for _, f := range c.feeds {
		if f.numbers && now >= f.confirmed+margin && f.swept != f.confirmed {
			f.swept = f.confirmed
			lapsing = true
		}
	}
	if lapsing && len(c.parked) > 0 {
		c.forgetCovers()
	}
}

// claim is Claim with c.mu held.
func (c *Coordinator) claim(t health.Target) (bool, health.Progress) {
	probe, covered := c.probes(t.Key, t.Addr)
	if !probe {
		// A live holder's status covers t: what this instance found
		// before (in local mode, or before the holder's status came) is
		// older than the holder's, and must not come back into the View
		// when the holder goes, before this instance's own next probe.
		// (The View does not change: it already takes the holder's.) Left
		// to its owner and not covered yet (see deferred), t keeps what
		// this instance found last: the View answers from it meanwhile.
		// Unless the holder's status is on its way to what this
		// instance found (see status.behind): that stays until the
		// holder's next probe decides.
		if !covered {
			return false, health.Progress{}
		}
		if own, had := c.own[t.Key]; had && !c.remote[t.Key].behind(own) {
			delete(c.own, t.Key)
			c.touch(t.Key)
		}
		return false, health.Progress{}
	}
	if r, ok := c.known(t.Key); ok && r.Addr == t.Addr {
		// Its holder's last known status, even with a gap pending (what
		// it published since may be missing, but this one was its own).
		if asOf, _ := c.asOf(r); asOf >= c.now()-c.b.cover().Microseconds() {
			return true, r.progress()
		}
	}
	// Nothing the fleet stands by to continue from (no status, one not
	// known current within the bound, or refused): a node nobody
	// vouches for must not stay in the answers for fall probes, so its
	// first failed probe takes it out (the checker bounds the failures
	// to its fall).
	return true, health.Progress{Fail: distrust}
}

// distrust is the failure count Claim seeds a target with when no status
// the fleet stands by covers it: the checker bounds it to fall, so that
// one more failure takes the target Down, while successes still need rise.
const distrust = 1 << 30

// KeepSession implements health.Sessions: the checker keeps a session open
// to t only while this instance holds t's lease for the fleet, so that the
// fleet keeps one session per node. In local mode every instance probes
// every node; sessions there would multiply by the number of instances
// (max_connections is 100 by default).
func (c *Coordinator) KeepSession(t health.Target) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mode == ModeCoordinated && c.held[t.Key]
}

// probes reports whether this instance probes key at addr: in local
// mode, unless another holder's status still covers it (see goLocal);
// otherwise while it holds the lease, and while no live holder's status
// covers it, unless it is left to its owner for now (see deferred).
// It reports too, when this instance does not probe key, whether a live
// holder's status covers it (see covered): each of the checker's Claims
// asks both, and at thousands of targets an instance's Claims are most of
// its work. c.mu is held.
func (c *Coordinator) probes(key string, addr netip.AddrPort) (probe, covered bool) {
	if c.mode == ModeLocal {
		if !c.coveredLocal(key, addr) {
			return true, false
		}
		return false, c.covered(key, addr)
	}
	if c.held[key] {
		return true, false
	}
	covered = c.covered(key, addr)
	return !covered && !c.deferred(key), covered
}

// localCover is, in local mode, a status of another holder that covered
// its key when Redis stopped answering: for its address, until (Redis µs)
// bounds.localCover after its holder was last confirmed.
type localCover struct {
	addr  netip.AddrPort
	until int64
}

// coveredLocal reports whether, in local mode, another holder's status
// still covers key at addr (see goLocal). c.mu is held.
func (c *Coordinator) coveredLocal(key string, addr netip.AddrPort) bool {
	return c.coveredLocalAt(key, addr, c.now())
}

// coveredLocalAt is coveredLocal at now (Redis µs). c.mu is held.
func (c *Coordinator) coveredLocalAt(key string, addr netip.AddrPort, now int64) bool {
	lc, ok := c.localCover[key]
	return ok && lc.addr == addr && now < lc.until
}

// covered reports whether a live holder's status covers key at addr: a
// status for that address, written after this instance last went local
// (one written before may say what its holder found before the outage:
// a Redis frozen, or restarted from a snapshot, gives it back as it
// was), that covers the key by the fleet's bounds (bounds.stale: by the live member
// the fleet gives the key to, with nothing its holder published missing
// here beyond a handoff, see asOf), and not by this instance unless it still holds the
// lease (one that lost it to anyone's write probes the key itself until
// it takes the lease back). c.mu is held.
func (c *Coordinator) covered(key string, addr netip.AddrPort) bool {
	return c.coveredAt(key, addr, c.now())
}

// coveredAt is covered at now (Redis µs). c.mu is held.
func (c *Coordinator) coveredAt(key string, addr netip.AddrPort, now int64) bool {
	if m, ok := c.covers[key]; ok && m.gen == c.coverGen && m.addr == addr && now <= c.memoEnd(m) {
		return true
	}
	r, ok := c.known(key)
	if !ok || r.Addr != addr || r.version < c.localAt || r.Holder == c.Token() && !c.held[key] {
		return false
	}
	asOf, ok := c.vouchedAt(key, r, now)
	if !ok {
		return false
	}
	// Not one of a holder handing the key over (see bounds.handover): that
	// cover turns on its holder staying a live member, which the members
	// can change without moving the key, and lasts a few seconds.
	if f := c.feeds[r.Holder]; r.Holder != c.Token() && r.Holder == c.ownerOf(key) && (f == nil || f.pending == 0) {
		c.covers[key] = coverMemo{gen: c.coverGen, until: asOf + c.b.cover().Microseconds(), addr: addr, holder: r.Holder, fed: f != nil && f.numbers}
	}
	return true
}

// coverMemo is what covered found of a key: covered at addr by another
// holder's status until (Redis µs), the moment that status's confirmation
// (see asOf) becomes too old. Every instance asks whether each target is
// covered at each of its probe ticks (Claim), most of them covered by
// others; at thousands of targets the maps that answer it (the status,
// its holder's feed, the owner, the members) are a cache miss each, and
// a memo is one. It holds until something covered turns on changes: the
// key's status (another applied, see forgetCover), or what the fleet is
// (the owners of the keys that moved, a return, a gap found in a holder's
// publishes, a feed forgotten or confirmed earlier than before: see
// forgetMoved, forgetCovers). Each later confirmation of its holder's
// feed moves its end on, as it moves the status's asOf (see memoUntil). A
// status of this instance's own, which turns on its lease, is never
// memoised; nor one whose holder has a gap pending, which lapses with
// time (see asOf).
type coverMemo struct {
	gen    uint64
	until  int64
	addr   netip.AddrPort
	holder string // the status's writer (see memoUntil)
	fed    bool   // its feed numbers its publishes: the cover goes on with its confirmations
}

// forgetCover drops key's coverMemo: its status changed. c.mu is held.
func (c *Coordinator) forgetCover(key string) {
	delete(c.covers, key)
	if _, ok := c.parked[key]; ok {
		delete(c.parked, key)
		c.rechecks = append(c.rechecks, key)
		c.wakeRechecks()
	}
}

// forgetCovers drops every coverMemo: something every key's coverage
// turns on changed. c.mu is held.
func (c *Coordinator) forgetCovers() {
	c.coverGen++
	c.ownAll = true // see view
	if len(c.parked) > 0 {
		clear(c.parked)
		c.rechecks, c.recheckAll = c.rechecks[:0], true
		c.wakeRechecks()
	}
}

// wakeRechecks tells the rechecks loop that keys were unparked. c.mu is
// held.
func (c *Coordinator) wakeRechecks() {
	select {
	case c.recheckWake <- struct{}{}:
	default:
	}
}

// rechecksLoop tells the checker, outside c.mu, of the keys whose memo
// was dropped while their ticks were parked, until ctx is done. Every
// cycle it sweeps the feeds whose covers are about to lapse (see
// sweepLapses).
func (c *Coordinator) rechecksLoop(ctx context.Context) {
	sweep := time.NewTicker(c.b.cycle)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.recheckWake:
		case <-sweep.C:
			c.mu.Lock()
			c.sweepLapses()
			c.mu.Unlock()
			continue // a forget wakes the loop
		}
		c.mu.Lock()
		keys, all := c.rechecks, c.recheckAll
		c.rechecks, c.recheckAll = nil, false
		one, every := c.recheck, c.recheckAllF
		c.mu.Unlock()
		switch {
		case all && every != nil:
			every()
		case one != nil:
			for _, k := range keys {
				one(k)
			}
		}
	}
}

// vouched reports whether the fleet stands by r, the status applied for
// key, by its bounds (bounds.stale): written by the live member the fleet
// gives the key to (or one handing it over), known to be its current
// status (no gap in its holder's publishes left unrepaired beyond a
// handoff, confirmed recently: see asOf), not ahead of the clock; and as
// of when (asOf). c.mu is held.
func (c *Coordinator) vouched(key string, r *remoteStatus) (asOf int64, ok bool) {
	return c.vouchedAt(key, r, c.now())
}

// vouchedAt is vouched at now (Redis µs). c.mu is held.
func (c *Coordinator) vouchedAt(key string, r *remoteStatus, now int64) (asOf int64, ok bool) {
	asOf, lapsed := c.asOf(r)
	return asOf, !lapsed && c.b.stale(r.Holder, c.ownerOf(key), r.version, asOf, c.members, now, c.b.cover()) == ""
}

// Record implements health.Shared: the verdict counts here at once; while
// this instance holds the lease, it is written to Redis too, fenced,
// renewing the lease, and published, with the next number of this
// instance's publishes, when it differs from the last one published (or
// when someone else wrote the stored status meanwhile, see
// WriteOptions.Expect); one that does not is written only once the
// status stored is a rewrite period old (see quiet), and its lease
// extended meanwhile (see extend).
//
// The write happens beside the probes, never in their way: a Redis that is
// frozen or slow holds up the status, not the next probe, so that this
// instance's own answers keep following the node while the fleet's wait
// for Redis. One write per key is in flight; a verdict recorded meanwhile
// follows it, replacing any that waited (the latest is what counts).
func (c *Coordinator) Record(t health.Target, p health.Progress) {
	c.mu.Lock()
	prev, had := c.own[t.Key]
	c.own[t.Key] = p
	c.touch(t.Key)
	if !had || !sameVerdict(prev, p, c.cfg.WAL, false) {
		c.wakeView()
	}
	if c.mode != ModeCoordinated || !c.held[t.Key] || c.closing {
		c.mu.Unlock()
		return
	}
	kl := c.kept[t.Key]
	kl.probed = true
	c.kept[t.Key] = kl
	if w, busy := c.writing[t.Key]; busy {
		w.next, w.waits = recorded{t, p}, true
		c.mu.Unlock()
		return
	}
	if c.quiet(t.Key, p) {
		c.mu.Unlock()
		return
	}
	c.writing[t.Key] = &keyWrite{}
	c.writes.Add(1)
	c.mu.Unlock()
	go c.writeLoop(recorded{t, p})
}

// keptLease is what this instance knows of a lease it holds.
type keptLease struct {
	// extended: when the lease was last extended (taken, written under,
	// or extended by tend), by this instance's clock, before the call.
	extended time.Time
	// probed: a probe of its target was recorded since.
	probed bool
	// stored: when a status of ours was last stored under it, moved
	// back by up to a rewrite period after a take (see write).
	stored time.Time
}

// publishes reports whether a write of p for key, which this instance
// holds, publishes it: its first since the lease was taken, a verdict, a
// counter or (with WAL) a position that differs from the last one
// published, or any while the fleet gives the key to another member that
// has not taken it over yet (the others take that status for a handover
// after its write only, see bounds.handover). c.mu is held.
func (c *Coordinator) publishes(key string, p health.Progress) bool {
	last, pubd := c.published[key]
	return !c.writtenBy[key] || !pubd || !sameVerdict(last, p, c.cfg.WAL, true) || c.ownerOf(key) != c.Token()
}

// quiet reports whether p, recorded for key, which this instance holds,
// is not written at all: nothing to publish, and our status stored under
// the lease less than a rewrite period ago (see bounds.rewrite). The
// lease is extended by tend meanwhile (see extend). c.mu is held.
func (c *Coordinator) quiet(key string, p health.Progress) bool {
	return !c.publishes(key, p) && time.Since(c.kept[key].stored) < c.b.rewrite()
}

// recorded is a verdict Record was given for a target.
type recorded struct {
	t health.Target
	p health.Progress
}

// keyWrite is a key's write in flight and the verdict waiting to follow it.
type keyWrite struct {
	next  recorded
	waits bool
}

// writeLoop writes r, then each verdict recorded for its key while a write
// was in flight, until none waits, this instance no longer holds the key,
// or Run is ending.
func (c *Coordinator) writeLoop(r recorded) {
	defer c.writes.Done()
	for {
		c.write(r.t, r.p)
		c.mu.Lock()
		w := c.writing[r.t.Key]
		if !w.waits || c.closing || c.mode != ModeCoordinated || !c.held[r.t.Key] {
			delete(c.writing, r.t.Key)
			c.mu.Unlock()
			return
		}
		r, w.waits = w.next, false
		c.mu.Unlock()
	}
}

// write writes p, the verdict on t, to Redis, fenced by t's lease, as
// Record says.
func (c *Coordinator) write(t health.Target, p health.Progress) {
	c.mu.Lock()
	write := c.mode == ModeCoordinated && c.held[t.Key] && !c.quiet(t.Key, p)
	publish := c.publishes(t.Key, p)
	first := !c.writtenBy[t.Key]
	// The version proposed: Redis's clock as known here, or above the
	// last one known when that is further on (writes within a
	// microsecond, a clock behind).
	propose := c.now()
	var expect int64 // the version we last stored, to find someone else's write
	if r, ok := c.known(t.Key); ok {
		propose = max(propose, r.version+1)
		if c.writtenBy[t.Key] && r.Holder == c.Token() {
			expect = r.version
		}
	}
	c.mu.Unlock()
	if !write {
		return
	}
	start := time.Now()
	st := newStatus(t.Addr, c.Token(), start, p)
	if publish {
		st.Seq = c.leases.seq.Add(1)
	}
	w, err := c.leases.writeVersioned(c.writeCtx, t.Key, propose, func(v int64) []byte {
		st.V = v
		return encode(c.cfg.macKey(t.Key), st, c.cfg.Secret)
	}, WriteOptions{Publish: publish, LeaseTTL: c.b.ttl, StatusTTL: statusTTL, StatusTTLEvery: statusTTLEvery, Ahead: c.b.ttl, Expect: expect})
	v, ok := w.version, w.ok
	st.V = v
	if ok && publish {
		c.leases.confirm(st.Seq)
	}
	c.observe(func(o Observer) { o.Write(ok, w.published) })
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case err != nil && c.writeCtx.Err() != nil:
		// Run is ending: a write cut short says nothing of Redis.
	case errors.Is(err, errContended):
		// Someone without the lease keeps moving the stored version:
		// the next probe writes again. Redis answers: no local mode.
		c.answered()
		c.rlog.Logf("contended", "%v", err)
	case err != nil:
		// One failed write is not an outage: it counts toward the
		// failure streak that local mode waits for (see failed).
		c.failed(start, err)
	case !ok:
		// Another instance holds the lease now (we were too slow, or
		// frozen), or anyone overwrote it: its holder's status counts,
		// not ours, and this instance probes the target itself until a
		// covering status comes (see covered).
		c.answered()
		if c.held[t.Key] {
			delete(c.held, t.Key)
			c.rlog.Logf("lease lost", "lease of %s lost to another instance", t.Key)
			c.observeLeases()
			c.signalKey(t.Key)
		}
	default:
		c.answered()
		c.writtenBy[t.Key] = true
		if w.published {
			c.published[t.Key] = p
		}
		// The status stays unwritten while its verdict does not change,
		// for a rewrite period; after a take, for a part of it drawn at
		// random, so that the rewrites of the statuses a fleet wrote at
		// once (its start, a return) spread over the period rather than
		// coming together.
		stored := start
		if first {
			stored = stored.Add(-rand.N(c.b.rewrite()))
		}
		c.kept[t.Key] = keptLease{extended: start, stored: stored}
		if r, had := c.known(t.Key); !had || v > r.version {
			c.remote[t.Key] = &remoteStatus{version: v, status: st}
			c.forgetCover(t.Key)
			c.touch(t.Key)
		}
	}
}

// intern returns key and holder as the same strings this instance's
// targets and members are held in, when they are among them: a status
// applied is looked up at every Claim of its key, and compared with its
// key's owner, and strings that share their bytes compare without reading
// them (at thousands of targets, reading a status's own copy of its key
// and holder misses the CPU's caches). c.mu is held.
func (c *Coordinator) intern(key, holder string) (string, string) {
	if k, ok := c.keyOf[key]; ok {
		key = k
	}
	if holder == c.Token() {
		holder = c.Token()
	} else if tok, ok := c.tokens[holder]; ok {
		holder = tok
	}
	return key, holder
}

// applyRemote applies a status read from Redis, live (published) or from a
// resync. Statuses that fail vetting and older versions are dropped.
func (c *Coordinator) applyRemote(key string, v int64, b []byte, live bool) {
	st, err := c.vet(key, v, b)
	if err != nil {
		c.refused(key, st, err)
		return
	}
	c.applyVetted(key, v, st, live)
}

// applyVetted applies st, a status of key with version v that passed
// vetting (see applyRemote).
func (c *Coordinator) applyVetted(key string, v int64, st status, live bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.wanted(key) {
		return
	}
	key, st.Holder = c.intern(key, st.Holder)
	if !live && v < c.now()-c.b.storedAge().Microseconds() {
		// A holder rewrites its status at least every rewrite
		// period, so a stored status older than storedAge is no
		// holder's any more: an old one stored again, perhaps, which an
		// instance that knows nothing newer (a new one) would otherwise
		// take. It checks the node itself instead.
		r, had := c.known(key)
		if !had || v <= r.version {
			return
		}
		// Newer than the status applied here, all the same, which is
		// then no holder's current one either: a message of the newer
		// one never came (a subscription that lost what was published
		// while it was made again, on a loaded machine whose holder's
		// rewrite came late). It replaces the older one, which the
		// holder's heartbeats would go on vouching for as long as its
		// verdict does not change, and the key is read again once its
		// holder has rewritten it. (Left without a status instead, the
		// key would be probed here: on a loaded fleet, many keys at
		// every instance.)
		c.rereads[key] = time.Now().Add(c.b.rewrite() + c.b.interval)
	}
	r, had := c.known(key)
	if had && v == r.version && st.Holder == r.Holder {
		return // our own write, or a resync of what we have
	}
	if had && v <= r.version {
		if live {
			c.observe(func(o Observer) { o.Message("stale") })
		}
		return
	}
	// One written before this instance last went local covers nothing
	// (see covered): a message Redis published before it stopped
	// (SIGSTOP, a pause) can reach the subscription only after the
	// return, and says what its holder found before the outage, not
	// since.
	c.remote[key] = &remoteStatus{version: v, status: st}
	c.forgetCover(key)
	c.touch(key)
	if live && c.held[key] && st.Holder != c.Token() {
		// A newer status of a key this instance holds, written by
		// another: anyone's write, without a secret. Its own goes out
		// again at its next probe, so that the others answer from that
		// one for at most an interval. (One naming this instance is
		// its own, heard before the reply to its write came back on a
		// loaded machine: taking it for another's would publish every
		// rewrite of the key again, and so on.)
		c.writtenBy[key] = false
	}
	if live {
		c.observe(func(o Observer) { o.Message("applied") })
		if st.Holder != c.Token() {
			d := time.Since(time.UnixMicro(st.At))
			c.observe(func(o Observer) { o.Propagation(max(d, 0)) })
		}
	}
	if !had || !sameVerdict(r.progress(), st.progress(), c.cfg.WAL, false) || r.Holder != st.Holder || r.Addr != st.Addr {
		c.wakeView()
	}
}

// signal tells Run's view loop to make a new View in which the entry of
// every target this instance has a verdict of may have changed: the
// members, the leases held, the mode or a holder's feed moved, which
// decide between its own verdict and the holder's (see entry). The entry
// of any other target is its holder's status, touched when that changes.
// c.mu is held.
func (c *Coordinator) signal() {
	c.ownAll = true
	c.wakeView()
}

// signalAll tells Run's view loop to make a new View, whole: any target's
// entry may have changed (the targets did). c.mu is held.
func (c *Coordinator) signalAll() {
	c.dirtyAll = true
	c.wakeView()
}

// signalKey tells Run's view loop to make a new View: key's entry may
// have changed. c.mu is held.
func (c *Coordinator) signalKey(key string) {
	c.touch(key)
	c.wakeView()
}

// touch notes that key's View entry may have changed, for the next View,
// without asking for one (see view). c.mu is held.
func (c *Coordinator) touch(key string) {
	if !c.dirtyAll {
		c.dirty[key] = struct{}{}
	}
}

// wakeView tells Run's view loop to make a new View. c.mu is held.
func (c *Coordinator) wakeView() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// view makes the View: this instance's own verdicts for the targets it
// probes, the holders' for the others. Before any target is known, every
// stored status that would cover its key counts (a cold start answers
// from them at once).
//
// A View of thousands of targets costs milliseconds, and every instance
// makes one for each change the fleet publishes: the next View is an Edit
// of the last one with only the entries that may have changed made again
// (at 10,000 targets, 18 µs where a whole one costs 2.9 ms:
// BenchmarkView); it shares the last one's other entries.
// Those are the keys touched since (their own verdict, status, or lease
// changed), and every key this instance probed and does not hold: whether
// its own verdict or its holder's answers turns on the holder's status
// still covering it, which lapses with time, not by a change here.
// The members, a lease taken or released, the mode or a holder's feed
// move only the entries of keys this instance has a verdict of (see
// entry): the next View makes each of those again (see signal). New
// targets make it whole (signalAll), as does a View with three quarters
// of the targets to make again (local mode, where this instance probes
// them all): an Edit makes only its entries again and then copies a
// pointer for each of the others, where a whole View makes every entry
// again (at a fleet's start an instance may have probed thousands of
// targets itself, whose entries each change of the members or the
// leases makes again; made whole at a quarter, those Views were most of
// a loaded start's work).
func (c *Coordinator) view() health.View {
	c.mu.Lock()
	defer c.mu.Unlock()
	defer func() {
		clear(c.dirty)
		c.dirtyAll, c.ownAll = false, false
	}()
	if len(c.targets) == 0 {
		c.lastView, c.lastMade = health.View{}, false
		v := map[string]health.Verdict{}
		for k := range c.remote {
			// Only what a live holder stands by: a status the fleet
			// would not let cover its key (its writer gone or not the
			// key's owner, or older than the bound: an old one stored
			// again) must not answer for it, even for a moment.
			r, ok := c.known(k)
			if !ok {
				continue
			}
			if _, ok := c.vouched(k, r); !ok {
				continue
			}
			if p := r.progress(); p.Verdict.State != health.Unknown {
				v[k] = p.Verdict
			}
		}
		return health.ViewOf(v)
	}
	if !c.dirtyAll && c.lastMade {
		// The entries of keys in own that this instance does not hold
		// turn on whether a holder's status covers them, which changes
		// by time alone (a cover lapses): each is made again when that
		// may have happened (ownDues), and all of them whenever
		// anything else that covered turns on changed (ownAll: see
		// forgetCovers). Otherwise only the keys touched since: at a
		// fleet's start, an instance's own holds thousands of keys it
		// probed before their holders' statuses came, and making them
		// all again at every View was most of its start.
		now := c.now()
		scanOwn := c.ownAll || c.mode == ModeLocal || len(c.ownDues) > 2*len(c.own)+64
		again := len(c.dirty)
		var due []string
		if scanOwn {
			for k := range c.own {
				if c.ownAll || !c.held[k] {
					again++
				}
			}
		} else {
			due = c.ownDues.due(now, c.dirty)
			again += len(due)
		}
		if again <= 3*len(c.targets)/4 {
			if scanOwn {
				c.ownDues = c.ownDues[:0] // made anew below
			}
			e := c.lastView.Edit()
			set := func(k string) {
				x, ok, oc := c.viewEntry(k, now)
				if ok {
					e.Set(k, x)
				} else {
					e.Delete(k)
				}
				c.ownDues.add(k, c.ownLapse(k, now, oc))
			}
			for k := range c.dirty {
				set(k)
			}
			for _, k := range due {
				set(k)
			}
			if scanOwn {
				for k := range c.own {
					if c.ownAll || !c.held[k] {
						set(k)
					}
				}
			}
			c.lastView = e.View()
			return c.lastView
		}
	}
	// Sized at once: grown entry by entry, a View of thousands of
	// targets costs its map's rehashes as much as the rest of its making.
	v := health.NewViewBuilder(len(c.targets))
	now := c.now()
	c.ownDues = c.ownDues[:0]
	for k := range c.targets {
		x, ok, oc := c.viewEntry(k, now)
		if ok {
			v.Set(k, x)
		}
		if oc != notOwn {
			c.ownDues = append(c.ownDues, ownDue{c.ownLapse(k, now, oc), k})
		}
	}
	heap.Init(&c.ownDues)
	c.lastView, c.lastMade = v.View(), true
	return c.lastView
}

// ownDue is when the entry of a key in own not held may next change by
// time alone (Redis µs, see ownLapse).
type ownDue struct {
	at  int64
	key string
}

// ownDues is a heap of the keys of own not held by when their entries
// may change by time alone, the earliest first: a View makes again those
// due, not every key of own. A key may be in it more than once (each
// View that made its entry again added it); one that is no longer in own
// not held is made again all the same when due, and then left out. When
// it holds many more than own, the next View makes all of own again and
// the heap anew.
type ownDues []ownDue

func (h ownDues) Len() int           { return len(h) }
func (h ownDues) Less(i, j int) bool { return h[i].at < h[j].at }
func (h ownDues) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *ownDues) Push(x any)        { *h = append(*h, x.(ownDue)) }
func (h *ownDues) Pop() any {
	old := *h
	d := old[len(old)-1]
	*h = old[:len(old)-1]
	return d
}

// add notes that key's entry may change by time alone at at (never:
// MaxInt64).
func (h *ownDues) add(key string, at int64) {
	if at != math.MaxInt64 {
		heap.Push(h, ownDue{at, key})
	}
}

// due takes the keys due at now off the heap, each once, leaving out
// those in skip (made again anyway).
func (h *ownDues) due(now int64, skip map[string]struct{}) []string {
	var out []string
	var seen map[string]bool // made only when something is due: a View comes at every change
	for h.Len() > 0 && (*h)[0].at <= now {
		d := heap.Pop(h).(ownDue)
		if _, ok := skip[d.key]; ok || seen[d.key] {
			continue
		}
		if seen == nil {
			seen = map[string]bool{}
		}
		seen[d.key] = true
		out = append(out, d.key)
	}
	return out
}

// nextDue is when the first key of h falls due, MaxInt64 for none.
func (h ownDues) nextDue() int64 {
	if len(h) == 0 {
		return math.MaxInt64
	}
	return h[0].at
}

// ownCover is what entry found of a key: whether it is in own and not
// held (its entry may change by time alone, see ownLapse), and if so
// whether a holder's status covers it.
type ownCover int8

const (
	notOwn       ownCover = iota // not in own, or held
	ownCovered                   // in own, not held, covered (see covered)
	ownUncovered                 // in own, not held, not covered
	ownLocal                     // in own, not held, in local mode and not covered there (see coveredLocal)
)

// ownLapse is when the entry of key may next change by time alone (Redis
// µs), its entry just made at now and oc found of it: never for a key not
// in own, or held, or in local mode and covered by no other holder's
// status there (its own verdict answers until the mode changes); when the
// coverMemo that covers it lapses, or without one (its holder has a gap
// pending) when the gap does; an interval on when nothing covers it (a
// status confirmed again by its holder's heartbeat may cover it: the
// feeds are not watched key by key); and in local mode at the latest when
// the status that covers it there stops covering it. c.mu is held.
func (c *Coordinator) ownLapse(key string, now int64, oc ownCover) int64 {
	lapse := now + c.b.interval.Microseconds()
	switch oc {
	case notOwn, ownLocal:
		return math.MaxInt64
	case ownCovered:
		if m, ok := c.covers[key]; ok && m.gen == c.coverGen {
			lapse = c.memoEnd(m)
		} else if r, ok := c.remote[key]; ok {
			if f := c.feeds[r.Holder]; f != nil && f.pending != 0 {
				// Its holder has a gap pending, which lapses a
				// handoff after it was found (see asOf).
				lapse = now + max(c.b.handoff()-time.Since(f.gapAt), 0).Microseconds()
			}
			if r.Holder != c.ownerOf(key) {
				// Handed over: covered until a handover after its
				// write (see bounds.handover).
				lapse = min(lapse, r.version+c.b.handover().Microseconds()+1)
			}
		}
	}
	if lc, ok := c.localCover[key]; ok && c.mode == ModeLocal {
		// Covered there until the other holder's status stops
		// covering it (see coveredLocal).
		lapse = min(lapse, lc.until)
	}
	return lapse
}

// viewEntry returns key's entry of the View, and whether it has one (see
// entry). An entry whose verdict is the last View's but for the time of
// its probe keeps the last View's time for a rewrite period: it is shown
// as fresh as the fleet's statuses are (a holder stores a quiet one again
// every rewrite period), not made again at every probe of every target
// this instance holds, each a change of the View. c.mu is held.
func (c *Coordinator) viewEntry(key string, now int64) (health.Verdict, bool, ownCover) {
	x, ok, oc := c.entry(key, now)
	if !ok {
		return x, false, oc
	}
	if was, had := c.lastView.Get(key); had && was.Equal(x, true) && x.Last.Sub(was.Last) < c.b.rewrite() && !x.Last.Before(was.Last) {
		return was, true, oc
	}
	return x, true, oc
}

// entry returns key's entry of the View, and whether it has one: this
// instance's own verdict where it probes the target, or probed it last and
// no holder's status covers it yet (it is left to its owner meanwhile:
// after a return, what this instance found in local mode is newer than
// what the fleet knew before the outage) or the holder's is on its way to
// it (see status.behind); else the holder's; none for a key that is not a
// target or whose verdict is unknown. c.mu is held.
func (c *Coordinator) entry(key string, now int64) (health.Verdict, bool, ownCover) {
	addr, ok := c.targets[key]
	if !ok {
		return health.Verdict{}, false, notOwn
	}
	var p health.Progress
	r, ok := c.remote[key]
	ok = ok && r.Addr == addr
	own, mine := c.own[key]
	oc := notOwn
	if mine && !c.held[key] {
		switch {
		case c.mode == ModeLocal && !c.coveredLocalAt(key, addr, now):
			oc = ownLocal
		case c.coveredAt(key, addr, now):
			oc = ownCovered
		default:
			oc = ownUncovered
		}
	}
	switch {
	case mine && oc != ownCovered:
		p = own
	case ok && mine && r.behind(own):
		p = own
	case ok:
		p = r.progress()
	}
	if p.Verdict.State == health.Unknown {
		return health.Verdict{}, false, oc
	}
	return p.Verdict, true, oc
}

// tend is one round of looking after membership and leases: heartbeat
// (whose failures over two cycles mean local mode, see failed, and whose
// success after it a return), then take the leases that are ours by
// rendezvous (none before takeFrom) and release the others.
func (c *Coordinator) tend(ctx context.Context) {
	defer c.tookTurn()
	start := time.Now()
	m, err := c.heartbeat(ctx)
	if err != nil {
		c.lost(ctx, start, err)
		return
	}
	p := c.round(m)
	// The targets this instance takes back after a return, and those it
	// probes on after one (see plan): in local mode their probes may wait
	// for the probe budget, like every target's; they come at their
	// phases instead, as they would have had Redis never stopped, not
	// all at once as the budget frees up (nor while the takes below wait
	// for Redis).
	for _, k := range p.rephase {
		p.probeAtPhase(k)
	}
	start = time.Now()

	if p.read {
		c.signalRead()
	}
	if err := c.leases.ReleaseAll(ctx, p.release); err != nil {
		c.lost(ctx, start, err)
		return
	}
	taken, void, err := c.leases.TakeAll(ctx, p.take, c.b.ttl, m.Members, p.tried, p.from)
	if err != nil {
		c.lost(ctx, start, err)
		return
	}
	for _, k := range void {
		c.rlog.Logf("lease void", "lease of %s was held by no live member, without a TTL or with one beyond any lease's: taken over", k)
	}
	if seize := c.blockedFor(p.take, taken); len(seize) > 0 {
		if err := c.leases.SeizeAll(ctx, seize, c.b.ttl); err != nil {
			c.lost(ctx, start, err)
			return
		}
		for _, k := range seize {
			c.rlog.Logf("lease seized", "lease of %s kept from this instance, which the fleet gives it to, for over a lease (%v) by a member that does not write it: taken over", k, c.b.ttl)
		}
		taken = append(taken, seize...)
	}
	var kick []string
	var rewrite []recorded
	c.mu.Lock()
	c.answered()
	for _, k := range p.release {
		delete(c.held, k)
	}
	for _, k := range taken {
		c.held[k] = true
		c.writtenBy[k] = false
		c.kept[k] = keptLease{extended: start}
		own, found := c.own[k]
		r, handed := c.known(k)
		if handed = handed && p.from[k] != "" && r.Holder == p.from[k] && r.Addr == c.targets[k]; handed {
			_, handed = c.vouched(k, r) // its holder live, and the status within a handover
		}
		switch {
		case c.returnOwners[k] == c.Token() && found:
			// Held before the outage: its status is written from what
			// this instance found in local mode (see plan).
			rewrite = append(rewrite, recorded{health.Target{Key: k, Addr: c.targets[k]}, own})
		case handed:
			// Taken over from a holder that was probing it: its last
			// verdict, with its counters, is written at once as this
			// instance's, which the fleet takes from its owner, and
			// probed when the checker comes to it. Until then the
			// holder's status would cover it only for a handover, and a
			// new member on a loaded machine may probe late: every
			// instance would probe it meanwhile.
			rewrite = append(rewrite, recorded{health.Target{Key: k, Addr: c.targets[k]}, r.progress()})
			if p.kickTaken {
				kick = append(kick, k)
			}
		case p.kickTaken:
			kick = append(kick, k)
		}
	}
	if len(p.release) > 0 || len(taken) > 0 {
		c.observeLeases()
		// Of the entries, only those of the keys whose leases moved
		// turn on it (see entry).
		for _, k := range p.release {
			c.touch(k)
		}
		for _, k := range taken {
			c.touch(k)
		}
		c.wakeView()
	}
	c.mu.Unlock()
	for _, r := range rewrite {
		c.Record(r.t, r.p)
	}
	for _, k := range kick {
		p.probeNow(k)
	}
	c.extend(ctx)
}

// extend extends the leases this instance holds whose statuses it did not
// write for half a lease (see bounds.extendAfter), which a write would
// have extended: those whose verdicts did not change (see quiet). Only
// those probed since their last extension: a lease whose target this
// instance no longer probes (its checker stuck, say) lapses, and its
// owner takes it again. A lease Redis no longer has is not ours any more:
// its target is probed here until a holder's status covers it, as after a
// write refused (see write).
func (c *Coordinator) extend(ctx context.Context) {
	c.mu.Lock()
	var keys []string
	for k, kl := range c.kept {
		switch {
		case !c.held[k]:
			delete(c.kept, k)
		case kl.probed && time.Since(kl.extended) >= c.b.extendAfter():
			keys = append(keys, k)
		}
	}
	c.mu.Unlock()
	if len(keys) == 0 {
		return
	}
	start := time.Now()
	lost, err := c.leases.ExtendAll(ctx, keys, c.b.ttl)
	if err != nil {
		c.lost(ctx, start, err)
		return
	}
	c.extensions.Add(int64(len(keys)))
	c.observe(func(o Observer) { o.Extend(len(keys)-len(lost), len(lost)) })
	c.mu.Lock()
	defer c.mu.Unlock()
	c.answered()
	for _, k := range keys {
		if kl, ok := c.kept[k]; ok && c.held[k] {
			kl.extended, kl.probed = start, false
			c.kept[k] = kl
		}
	}
	for _, k := range lost {
		if c.held[k] {
			delete(c.held, k)
			delete(c.kept, k)
			c.rlog.Logf("lease lost", "lease of %s lost: Redis no longer has it", k)
			c.signalKey(k)
		}
	}
	if len(lost) > 0 {
		c.observeLeases()
	}
}

// tookTurn notes that a round of tend that could take leases (one at or
// past takeFrom) ended, whatever it took.
func (c *Coordinator) tookTurn() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !time.Now().Before(c.takeFrom) {
		c.tookFirst = true
	}
}

// heartbeat renews this instance's membership and reads the fleet's (see
// Leases.Heartbeat), logging what it refused.
func (c *Coordinator) heartbeat(ctx context.Context) (Membership, error) {
	read := c.leases.Heartbeat
	if c.cfg.Passive {
		read = func(ctx context.Context, _, ahead time.Duration) (Membership, error) {
			return c.leases.Watch(ctx, ahead)
		}
	}
	m, err := read(ctx, c.b.memberTTL, c.b.memberAhead())
	for _, err := range m.Refused {
		c.rlog.Logf("member "+refusalKind(err), "a member of the fleet ignored: %v", err)
	}
	for _, err := range m.WatermarksRefused {
		c.rlog.Logf("watermark "+refusalKind(err), "a member's watermark ignored: %v", err)
	}
	return m, err
}

// tendPlan is what a round of tend does once its heartbeat answered.
type tendPlan struct {
	take, release []string          // leases to take and to release
	kickTaken     bool              // probe the leases taken at once (see plan)
	tried         map[string]bool   // keys whose take failed before (see TakeAll)
	from          map[string]string // keys to take over from the holder whose status is known here (see TakeAll)
	read          bool              // a holder's statuses are to be read again (a gap)
	probeNow      func(key string)
	rephase       []string // targets whose waiting probes go to their phases (see tend)
	probeAtPhase  func(key string)
}

// round applies the membership a heartbeat read and returns what the
// round does next (see plan). When the members changed, the targets'
// owners are computed again, outside c.mu (at 300 members and 10,000
// targets it takes tens of milliseconds, which the checker's Claims must
// not wait for).
func (c *Coordinator) round(m Membership) tendPlan {
	c.mu.Lock()
	var keys []string
	var was *ownership
	changed := !slices.Equal(m.Members, c.memberList)
	if changed {
		keys = slices.Collect(maps.Keys(c.targets))
		was = c.ownership()
	}
	c.mu.Unlock()
	var next *ownership
	if changed {
		next = was.next(newRanking(m.Members), keys)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.plan(m, next)
}

// ownership returns the targets' owners now. c.mu is held.
func (c *Coordinator) ownership() *ownership {
	return &ownership{rank: c.rank, owners: c.owners, top: c.top}
}

// plan applies the membership a heartbeat read (a return to coordinated
// mode, the live members and their watermarks, Redis's clock) and returns
// what the round does next. next is the targets' owners for those members
// when they changed (targets added since are added to it), nil when they
// did not. c.mu is held.
//
// A lease taken is probed at once, so that its target's new owner covers
// it soon (the others leave it to it meanwhile, see deferred), except in
// the interval after a return's first takes: every instance comes back at
// once then, each with its share of the targets, which it probed in local
// mode at their own ticks, spread over an interval; probed at once, they
// would all be probed in the same moment.
func (c *Coordinator) plan(m Membership, next *ownership) tendPlan {
	members := m.Members
	var p tendPlan
	c.answered()
	rejoin := false
	if c.mode != ModeCoordinated {
		if c.mode == ModeLocal {
			// A return: statuses stored before this instance went
			// local may predate the outage. They cover nothing (see
			// covered) until published again (a holder's first write
			// after taking its lease back is) or rewritten, which a
			// read of every status after every holder has probed
			// once will show (see reads). One written since, however
			// it reaches this instance (heard, or read: a
			// subscription made again after a Redis restart misses
			// what was published before it), was written after the
			// outage began, by a holder that came back before this
			// one or that never lost Redis: it counts at once.
			rejoin = true
			c.joinedAt = m.Now.UnixMicro()
			c.localCover = nil
			// Each target stays with the member that held it before
			// the outage: that member takes it back at once (below)
			// and writes what it found in local mode, and the others
			// stop probing it at once, answering from what they found
			// until that status comes (see deferred). A fleet that
			// probed every target once per instance in local mode so
			// comes back to one prober per target as each instance
			// hears Redis again, not an interval or two later. After
			// the handoff, a target whose owner did not write it is
			// probed here again (an owner that did not come back).
			if !c.cfg.Passive {
				c.returnOwners = maps.Clone(c.owners)
				c.returnUntil = time.Now().Add(c.b.handoff())
			}
			c.resyncAt = time.Now().Add(c.b.interval + c.b.timeout + c.b.cycle + c.stagger())
			// A holder that never lost Redis publishes nothing again
			// and rewrites a status whose verdict did not change only
			// every rewrite period (see quiet): its statuses stored
			// before the return count here once a read after that
			// period finds them rewritten.
			c.rereadAt = c.resyncAt.Add(c.b.rewrite())
			c.safetyAt = c.resyncAt.Add(c.b.safetyEvery(len(members)))
			// Leases this instance did not hold before the outage (the
			// members changed meanwhile) come later: the fleet comes
			// back at once, its members first (after an outage longer
			// than a membership, Redis holds none), then those leases,
			// staggered as at a start, so that no member takes what the
			// others' return moves away again.
			c.takeFrom = time.Now().Add(c.b.cycle + c.stagger())
			c.quietUntil = c.takeFrom.Add(c.b.interval)
			c.modef("Redis answers again: rejoining the fleet, %d members", len(members))
		} else if c.cfg.Passive {
			c.modef("Redis answers: following the fleet's statuses without probing, %d members", len(members))
		} else {
			c.modef("Redis answers: coordinating with the fleet, %d members", len(members))
		}
		c.mode = ModeCoordinated
		c.observe(func(o Observer) { o.Mode(ModeCoordinated) })
		c.observeLeases()
		c.signal() // which verdict answers for each target: see viewEntry
	}
	if !slices.Equal(members, c.memberList) {
		if next == nil {
			next = c.ownership().next(newRanking(members), slices.Collect(maps.Keys(c.targets)))
		}
		c.members = make(map[string]bool, len(members))
		c.tokens = make(map[string]string, len(members))
		for _, tok := range members {
			c.members[tok] = true
			c.tokens[tok] = tok
		}
		c.memberList = members
		c.rank = next.rank
		c.forgetMoved(c.setOwners(next))
		// The statuses of holders handing a key over cover it while
		// their holder is a live member (see bounds.handover), which
		// the members can change without moving the key: the entries
		// of those this instance probed turn on it.
		for k := range c.own {
			if r, ok := c.remote[k]; ok && !c.held[k] && r.Holder != c.owners[k] {
				c.touch(k)
				c.wakeView()
			}
		}
	}
	c.offset = time.Until(m.Now)
	p.read = c.noteMarks(m, rejoin || c.subscribed)
	c.subscribed = false
	// Targets no longer covered (their holder left, or the fleet gives
	// them to another member) are left to their new owners for a handoff
	// (see setOwners), which take them at once below.
	c.dropHandoffs()
	now := time.Now()
	me := c.Token()
	if !now.Before(c.returnUntil) {
		c.returnOwners = nil
	}
	for _, k := range c.mine {
		if !c.held[k] && (c.returnOwners[k] == me || !now.Before(c.takeFrom)) {
			// Ours: taken from takeFrom on; one held before an outage
			// is taken back at once, and its status written from what
			// this instance found in local mode (see tend), not probed
			// at once.
			p.take = append(p.take, k)
			if rejoin && c.returnOwners[k] == me {
				p.rephase = append(p.rephase, k)
			}
		}
	}
	if rejoin {
		// Those whose verdict here was turning when Redis returned (a
		// fall begun in local mode: a backend stopped meanwhile) are
		// probed on until their holder's status comes (see deferred),
		// by every instance that counted a failure of theirs: at their
		// phases too, not together as the budget frees up, which was a
		// burst of probes of the same few backends from most of the
		// fleet.
		for k := range c.own {
			if c.returnOwners[k] != me && c.turning(k) {
				p.rephase = append(p.rephase, k)
			}
		}
	}
	// A key the fleet moved to another member is kept, probed, written
	// and published at each probe (see publishes) until that member takes
	// it over (its take names this instance, see TakeAll), which this
	// instance learns at its next write, refused: the others take its
	// statuses meanwhile (see bounds.handover), so that neither a member
	// that joins and takes long to start (on a loaded machine, tens of
	// seconds) nor one anyone added and that never takes anything has
	// every instance probe what moved to it.
	for k := range c.held {
		if _, ok := c.targets[k]; !ok {
			p.release = append(p.release, k)
		}
	}
	for _, k := range p.take {
		if r, ok := c.known(k); ok && r.Holder != me {
			if p.from == nil {
				p.from = make(map[string]string)
			}
			p.from[k] = r.Holder
		}
	}
	p.kickTaken = !now.Before(c.quietUntil)
	p.probeNow, p.probeAtPhase = c.probeNow, c.probeAtPhase
	p.tried = c.blockedSet()
	return p
}

// setOwners makes c.owners the owner among c.memberList of every target
// and of no other key, taking those of from that are there (computed for
// c.memberList) and computing the others, and leaves each target whose
// owner is now another live member than before to it for a handoff (see
// deferred). The owners are computed again only when the members or the
// targets change: at 300 members a key's owner costs microseconds, too
// much for every target at every round and every Claim. It returns the
// targets whose owner changed. c.mu is held.
func (c *Coordinator) setOwners(from *ownership) (moved []string) {
	owners, top := from.owners, from.top
	same := len(owners) == len(c.targets) && len(top) == len(c.targets)
	for k := range c.targets {
		if !same {
			break
		}
		_, same = owners[k]
	}
	if !same {
		// Targets changed since from was computed: its maps, which
		// others may share, stay as they are.
		owners, top = make(map[string]string, len(c.targets)), make(map[string]uint64, len(c.targets))
		for k := range c.targets {
			o, ok := from.owners[k]
			s, scored := from.top[k]
			if !ok || !scored {
				o, s = c.rank.best(k)
			}
			owners[k], top[k] = o, s
		}
	}
	until := time.Now().Add(c.b.handoff())
	me := c.Token()
	c.mine = c.mine[:0]
	for k := range c.targets {
		o := owners[k]
		if o == me {
			c.mine = append(c.mine, k)
		}
		if was, had := c.owners[k]; !had || was != o {
			moved = append(moved, k)
			if o != me && c.members[o] {
				c.handoffs[k] = until
			}
		}
	}
	c.owners, c.top = owners, top
	return moved
}

// forgetMoved drops what covered found of the targets whose owner changed
// with the members (moved, see setOwners), and has the next View make
// their entries again. Nothing else a cover turns on moves with the
// members: a status covers its key only when its writer is the key's
// owner (bounds.stale), and an owner is always a live member, so a key
// whose owner stayed is covered, or not, as before. A member that joins
// a fleet of a hundred moves a hundredth of the keys; forgetting every
// cover at each join had each instance ask again about every target it
// leaves to others, and make every entry of its own again, as each of a
// new wave of instances came. Where more than a quarter moved, every
// cover is forgotten at once. c.mu is held.
func (c *Coordinator) forgetMoved(moved []string) {
	if 4*len(moved) > len(c.targets) {
		c.forgetCovers()
		c.signal()
		return
	}
	for _, k := range moved {
		c.forgetCover(k)
		c.touch(k)
	}
	if len(moved) > 0 {
		c.wakeView()
	}
}

// ownerOf is the live member the fleet gives key to. c.mu is held.
func (c *Coordinator) ownerOf(key string) string {
	if o, ok := c.owners[key]; ok {
		return o
	}
	return c.rank.owner(key) // a key that is not a target: a cold start's
}

// blockedFor returns the keys of take, not taken, whose take has failed
// for longer than a lease: a live member holds them, but not as their
// owner. A holder the fleet moved a key away from hands it over to a take
// that names it (see TakeAll), which a take by the new owner does once
// the holder's status reached it, and one that stopped lapses from the
// members within a lease; a lease kept longer is anyone's write naming a
// live member (or a holder this instance knew no status of), which would
// keep the key's status from being written for as long as they keep
// writing it. A key seized within the last two leases is seized again at
// once: whoever took it back is no holder that lets go.
func (c *Coordinator) blockedFor(take, taken []string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	var seize []string
	for _, k := range take {
		if slices.Contains(taken, k) {
			delete(c.blocked, k)
			continue
		}
		since, ok := c.blocked[k]
		switch {
		case now.Sub(c.seized[k]) < 2*c.b.ttl, ok && now.Sub(since) > c.b.ttl:
			delete(c.blocked, k)
			c.seized[k] = now
			seize = append(seize, k)
		case !ok:
			c.blocked[k] = now
		}
	}
	for k := range c.blocked {
		if !slices.Contains(take, k) {
			delete(c.blocked, k)
		}
	}
	for k, at := range c.seized {
		if now.Sub(at) >= 2*c.b.ttl {
			delete(c.seized, k)
		}
	}
	return seize
}

// blockedSet is the keys whose take has failed before. c.mu is held.
func (c *Coordinator) blockedSet() map[string]bool {
	m := make(map[string]bool, len(c.blocked))
	for k := range c.blocked {
		m[k] = true
	}
	return m
}

// leave releases this instance's leases and ends its membership, so that
// the others take over at once instead of after the leases lapse.
func (c *Coordinator) leave() {
	c.mu.Lock()
	held := slices.Collect(maps.Keys(c.held))
	coordinated := c.mode == ModeCoordinated
	clear(c.held)
	c.mu.Unlock()
	if !coordinated || c.cfg.Passive {
		return
	}
	ctx := context.Background()
	if err := c.leases.ReleaseAll(ctx, held); err != nil {
		c.logf("%v", err)
	}
	if err := c.leases.Leave(ctx); err != nil {
		c.logf("%v", err)
	}
}

func (c *Coordinator) logf(format string, args ...any) {
	if c.cfg.Logf != nil {
		c.cfg.Logf(format, args...)
	}
}

// modef logs a change of mode, or a Redis call that may lead to one, unless
// QuietModes.
func (c *Coordinator) modef(format string, args ...any) {
	if !c.cfg.QuietModes {
		c.logf(format, args...)
	}
}

func (c *Coordinator) observe(f func(Observer)) {
	if c.cfg.Observer != nil {
		f(c.cfg.Observer)
	}
}

// observeLeases reports how many leases are held. c.mu is held.
func (c *Coordinator) observeLeases() {
	n := len(c.held)
	c.observe(func(o Observer) { o.Leases(n) })
}

var (
	_ health.Shared   = (*Coordinator)(nil)
	_ health.Sessions = (*Coordinator)(nil)
)
