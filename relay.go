package pgcluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/ratelog"
	"github.com/pgcluster/pgcluster/internal/rediserr"
	"github.com/pgcluster/pgcluster/lock"
)

// Timing of the registry relay.
const (
	// relayLease is the registry lease's TTL: a follower that dies is
	// replaced within it and a tick.
	relayLease = 3 * time.Second
	// relayTick is how often the follower renews the lease and vouches for
	// the copy, and (with ±20% jitter) how often every other instance
	// reads the copy's version and tries the lease.
	relayTick = 500 * time.Millisecond
	// relayFailures is how many Redis calls in a row must fail before a
	// reader follows PostgreSQL itself: one lost reply is no outage.
	relayFailures = 2
	// relaySessionGrace is how long a follower may go without a registry
	// session before it gives the lease up for another instance to try.
	relaySessionGrace = relayLease
	// relayRetry: a reader that refused the copy reads it again this soon
	// (the follower stores its own again over a forged one at its next
	// renewal), and news that brought nothing is heeded at most this
	// often, so that whoever publishes garbage costs a reader ten reads a
	// second at most.
	relayRetry = 100 * time.Millisecond
	// relayDistrust: a reader that has refused the copy for this long
	// follows PostgreSQL itself. It cannot tell what it misses meanwhile,
	// so this bounds how long it may serve a registry that moved on,
	// whoever keeps writing over the copy: well below the checks' bound
	// (fall × interval + timeout + lease).
	relayDistrust = time.Second
	// relayHold, doubled up to relayHoldMax while it keeps happening, is
	// how long an instance that follows PostgreSQL itself because it
	// refused the copy does so before it reads Redis again: a copy forged
	// again and again makes it switch that seldom, not at every forgery.
	relayHold    = 10 * time.Second
	relayHoldMax = 5 * time.Minute
	// relayFirstCopy is how long a new instance with nothing to serve
	// waits for a copy before it follows PostgreSQL itself, and
	// relayVouchWait how long it waits for the follower to vouch for the
	// copy there (a live follower does every relayTick: one that does not
	// has no registry session, or the copy is an old one replayed).
	relayFirstCopy = relayLease
	relayVouchWait = time.Second
	// relayCheckEvery: a follower whose renewal found its head overwritten
	// (and stored it again) reads the copy whole at most this often, to
	// find fields written by someone else too.
	relayCheckEvery = 5 * time.Second
	// relayExpiryMargin: a lease about to expire is polled this long after
	// its expiry as last seen.
	relayExpiryMargin = 5 * time.Millisecond
)

// Roles in the relay.
const (
	roleFollower = "follower"
	roleReader   = "reader"
	roleLocal    = "local"
)

// relay feeds the publisher the registry of a fleet sharing Redis. One
// instance, holding the registry lease, follows PostgreSQL (a registry, as
// without Redis) and writes each change it applies to the copy in Redis
// (lock.RegistryCopy) before applying it with the version written; every
// other instance reads the changes from the copy and holds no registry
// session (it reads the registry's system identifier once, to know its
// registry). The fleet's instances thus serve the same SOA serial, the
// version, for the same rows. A new follower reloads in full and writes
// the copy whole before it publishes. When Redis does not answer, every
// instance follows PostgreSQL itself (local) until Redis answers again and
// the follower vouches for a copy made since.
//
// Redis is not trusted: a copy counts only once vetted (signed, within
// bounds by Redis's clock, of this fleet's registry, and, for an instance
// that holds none yet, vouched for within a lease). A reader that refuses
// the copy reads it again soon, and follows PostgreSQL itself once it has
// refused it for relayDistrust, or at once when it has nothing to serve
// or the copy is another registry's; the follower finds what was written
// over its copy at its next renewal and writes its own again.
type relay struct {
	set  *settings
	pb   *publisher
	key  string // of lastLoads; "" keeps nothing
	kept bool
	rdb  redis.UniversalClient
	rc   *lock.RegistryCopy
	// dials are rdb's failed connections: they say what a call that only
	// timed out met (rediserr).
	dials *rediserr.Dials
	// warn and info write the lines that what is read from Redis causes:
	// one per kind per minute, whatever anyone writes there.
	warn, info *ratelog.Limiter

	updates chan relayUpdate
	polls   chan relayPoll // capacity 1: the poll in flight's result
	news    chan int64     // capacity 1: the version last published, 0 when a subscription began
	idents  chan uint64    // the registry's system identifier, once read
	idFails chan struct{}  // capacity 1: the first reading of it failed
	loaded  chan struct{}  // closed at the first rows applied
	done    chan struct{}  // closed when run returns

	// Touched only by restore and then run's goroutine.
	ctx     context.Context
	id      registryID // this instance's registry
	role    string
	rows    rowSet          // the registry as served here
	hasRows bool            // rows were applied
	st      *lock.CopyState // the copy as applied here, or as written (follower)
	written bool            // follower: this term's first, full write is done
	term    int64           // follower: Redis µs when its term began
	// termNow is term, for the alias mover (failover.go), which fences
	// its writes with it from its own goroutine.
	termNow atomic.Int64
	// followerNow is whether the role is follower, for the alias mover:
	// an instance that follows PostgreSQL itself because Redis does not
	// answer (roleLocal) moves no alias, the fleet's follower does.
	followerNow atomic.Bool
	redisNow    time.Time // Redis's clock at the last poll, read or renewal
	redisAt     time.Time // this host's clock then
	fails       int       // Redis calls failed in a row
	failedAt    time.Time // when the first of them failed
	// rideUntil: a reader that Redis stopped answering serves its copy
	// until then before it follows PostgreSQL itself (see ride).
	rideUntil time.Time
	back      time.Time // local: Redis's clock when it answered again
	// readHere is when the last read of PostgreSQL here that brought rows
	// began (local): the copy is read again only once the follower has
	// vouched for it since, so that a copy older than what this instance
	// served, an old genuine one replayed, say, is never served instead.
	readHere time.Time
	leaveBy  time.Time     // leave the lease to others until then
	left     time.Duration // the lease's time to live at the last poll, 0 without one
	started  time.Time     // of run
	checked  time.Time     // follower: when the copy was last checked
	// distrust is since when a reader has refused the copy (zero: it has
	// not), quiet until when news is not heeded (a read just brought
	// nothing), and retry re-reads a refused copy, or news held back.
	distrust   time.Time
	quiet      time.Time
	retry      *time.Timer
	retrying   bool
	pending    bool             // news held back, for retry to read
	holdUntil  time.Time        // local because a copy was refused: read Redis again from then
	hold       time.Duration    // the last hold (see relayHold)
	rejoinedAt time.Time        // when this instance last read Redis again after a hold
	unvouched  bool             // a copy the follower had not vouched for was not taken
	idFailed   bool             // the registry's system identifier could not be read (yet): copies are checked without it
	follow     *relayFollowing  // the registry session, while following PostgreSQL here
	gen        int              // of the last relayFollowing
	logged     map[string]error // the last failure of each kind logged
}

// relayUpdate is a registry's update, tagged with the registry it comes
// from: one stopped meanwhile is not heard.
type relayUpdate struct {
	gen int
	u   rowsUpdate
}

// relayPoll is what a poll of the copy brought.
type relayPoll struct {
	p   lock.CopyPoll
	err error
}

// relayFollowing is a registry followed here.
type relayFollowing struct {
	reg    *registry
	cancel context.CancelFunc
	gen    int
	up     atomic.Bool
	// failed: a session failed (or could not start) since this one began.
	failed atomic.Bool
	// downSince is when the session was last down (or the registry
	// started), in Unix ns.
	downSince atomic.Int64
}

func newRelay(set *settings, pb *publisher, key string) (*relay, error) {
	rdb, err := newRedisClient(set.redisURL)
	if err != nil {
		return nil, err
	}
	rc, err := lock.NewRegistryCopy(rdb, set.redisPrefix, set.redisSecret, relayLease, set.token)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return &relay{
		set: set, pb: pb, key: key, rdb: rdb, rc: rc, dials: rediserr.Watch(rdb),
		warn:    ratelog.New(log.Warningf, 0),
		info:    ratelog.New(log.Infof, 0),
		updates: make(chan relayUpdate),
		polls:   make(chan relayPoll, 1),
		news:    make(chan int64, 1),
		idents:  make(chan uint64, 1),
		idFails: make(chan struct{}, 1),
		loaded:  make(chan struct{}),
		done:    make(chan struct{}),
		id:      configRegistryID(set),
		st:      &lock.CopyState{},
		hold:    relayHold,
		logged:  map[string]error{},
	}, nil
}

// restore publishes the rows the instance before this one (same DSN and
// zones, before a Corefile reload) served last, as registry.restore does.
// Call it once, before run.
func (r *relay) restore() bool {
	u, last := lastLoads.restore(r.key, &r.kept)
	if last == nil {
		return false
	}
	r.apply(u, last.loadedAt)
	log.Infof("Registry relay: serving the %d clusters and %d aliases the instance before this one served, until the registry is read again",
		len(last.rows.clusters), len(last.rows.aliases))
	return true
}

// run relays until ctx is done, then gives the lease up.
func (r *relay) run(ctx context.Context) {
	defer close(r.done)
	defer r.rdb.Close()
	defer func() {
		if r.kept {
			lastLoads.release(r.key)
		}
	}()
	r.ctx, r.started = ctx, time.Now()
	r.retry = time.NewTimer(time.Hour)
	r.retry.Stop()
	defer r.retry.Stop()
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.watch(wctx) })
	if !r.set.passive {
		// A passive instance reaches no database: it knows the registry
		// by database and zones only.
		wg.Go(func() { r.identify(wctx) })
	}
	defer func() {
		stopWatch()
		wg.Wait()
	}()

	// A poll runs on its own goroutine, so that the updates of a registry
	// followed here (local) are applied at once even while Redis takes
	// its deadline to fail; the timer is armed again once it is handled.
	var polls sync.WaitGroup
	defer polls.Wait()
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.stopFollowing()
			r.leave()
			return
		case <-t.C:
			if r.role == roleFollower {
				r.renew()
				t.Reset(r.nextTick())
				continue
			}
			take := time.Now().After(r.leaveBy) && !r.set.passive
			polls.Go(func() {
				p, err := r.rc.Poll(ctx, take, relayLease)
				r.polls <- relayPoll{p, err}
			})
		case res := <-r.polls:
			r.polled(res.p, res.err)
			t.Reset(r.nextTick())
		case v := <-r.news:
			r.heard(v)
		case <-r.retry.C:
			r.retrying = false
			r.retried()
		case sys := <-r.idents:
			r.learned(sys)
		case <-r.idFails:
			r.unidentified()
		case up := <-r.updates:
			if r.follow != nil && up.gen == r.follow.gen {
				r.fromRegistry(up.u)
			}
		}
	}
}

// watch wakes run on every version published and every subscription.
func (r *relay) watch(ctx context.Context) {
	for ctx.Err() == nil {
		err := r.rc.Watch(ctx, func(v int64) {
			// The latest news replaces news not taken yet.
			for {
				select {
				case r.news <- v:
					return
				default:
				}
				select {
				case <-r.news:
				default:
				}
			}
		}, func(err error) {
			// Counted and logged from here (both are safe to): nothing of
			// such a message reaches run.
			relayReads.WithLabelValues(r.zone(), "rejected").Inc()
			r.warn.Logf("news", "Registry relay: %v: ignored", err)
		})
		if ctx.Err() == nil {
			r.logOnce("watch", err, "Registry relay: %v", err)
			select {
			case <-ctx.Done():
			case <-time.After(relayTick):
			}
		}
	}
}

// nextTick is relayTick, with jitter but for the follower, so that a
// fleet's polls spread out; or, when the lease is about to expire (its
// holder died or stalls), just after it does, so that another instance
// takes it at once.
func (r *relay) nextTick() time.Duration {
	if r.role == roleFollower {
		return relayTick
	}
	next := relayTick*8/10 + rand.N(relayTick*4/10)
	if r.left > 0 && r.left+relayExpiryMargin < next {
		next = r.left + relayExpiryMargin
	}
	return next
}

// polled acts on a poll of the copy's version and head, which took the
// lease when it was free and not left to others.
func (r *relay) polled(p lock.CopyPoll, err error) {
	r.left = 0
	if err != nil {
		r.redisFailed(err)
		return
	}
	if !p.Taken && p.Holder != r.rc.Token() {
		r.left = p.Left
	}
	r.redisOK(p.Now)
	if p.Taken || p.Holder == r.rc.Token() {
		// Ours: taken now, or kept through an outage shorter than it.
		r.becomeFollower(p.Now)
		return
	}
	h, herr := r.rc.PollHead(p)
	if r.role == roleLocal {
		r.rejoin(p, h, herr)
		return
	}
	if r.role == "" {
		r.setRole(roleReader)
		// Only the holder's own log can name its host (its token is not
		// a fleet member's): say where to look.
		log.Infof("Registry relay: reading the registry from Redis; instance %s follows PostgreSQL for the fleet (its log names its host: \"took the registry lease as instance %s\")", short(p.Holder), short(p.Holder))
	}
	switch {
	case errors.Is(herr, lock.ErrNoCopy):
		r.setRegistryUp(false)
	case herr != nil:
		r.sharedPrefix(p, herr)
		r.refused("rejected", herr)
	case !r.id.names(h.Registry):
		r.foreign(h.Registry)
	case p.Version != r.st.Version || r.st.Empty():
		if !r.retrying {
			r.catchUp(false)
		}
	default:
		r.trusted()
		r.registryUp(h)
	}
	if since := time.Since(r.started); r.role == roleReader && !r.hasRows && (since > relayFirstCopy || r.unvouched && since > relayVouchWait) {
		// No copy fit to serve, and nothing else: the registry itself.
		r.goLocal(errors.New("no registry copy fit to serve"), p.Now)
	}
}

// heard acts on news from the copy's channel: v published, or 0 when a
// subscription began. A version that is not after the one applied, or is
// ahead of Redis's clock, is not read for: the poll finds a copy that
// went back, and whoever publishes garbage makes no reads.
func (r *relay) heard(v int64) {
	if r.role != roleReader {
		return
	}
	if v > lock.MaxCopyVersion(r.redisClock()) {
		relayReads.WithLabelValues(r.zone(), "rejected").Inc()
		r.warn.Logf("news", "Registry relay: version %d published, ahead of Redis's clock: ignored", v)
		return
	}
	if v != 0 && v <= r.st.Version {
		return
	}
	if r.retrying || time.Now().Before(r.quiet) {
		r.pending = true
		r.retryIn(time.Until(r.quiet))
		return
	}
	r.catchUp(false)
}

// retried reads the copy again: news held back, or a copy refused.
func (r *relay) retried() {
	pending := r.pending
	r.pending = false
	if r.role != roleReader || !pending && r.distrust.IsZero() {
		return
	}
	if r.catchUp(false) || r.distrust.IsZero() {
		return
	}
	r.distrusted()
}

// retryIn arms retry, unless it is armed.
func (r *relay) retryIn(d time.Duration) {
	if r.retrying {
		return
	}
	r.retrying = true
	r.retry.Reset(max(d, time.Millisecond))
}

// refused counts a copy refused (result: rejected or stale) and reads it
// again soon, or follows PostgreSQL itself (distrusted).
func (r *relay) refused(result string, err error) {
	relayReads.WithLabelValues(r.zone(), result).Inc()
	r.setRegistryUp(false)
	r.quiet = time.Now().Add(relayRetry)
	if r.distrust.IsZero() {
		r.distrust = time.Now()
	}
	r.warn.Logf("refused "+result, "Registry relay: %v: not applied", err)
	r.distrusted()
}

// distrusted is a reader that refuses the copy: it follows PostgreSQL
// itself once it has refused it for relayDistrust, or at once when it
// has nothing to serve; until then it reads the copy again every
// relayRetry.
func (r *relay) distrusted() {
	if r.role != roleReader || r.distrust.IsZero() {
		return
	}
	if r.hasRows && time.Since(r.distrust) < relayDistrust {
		r.retryIn(relayRetry)
		return
	}
	why := fmt.Errorf("the registry copy in Redis was refused for %v", time.Since(r.distrust).Round(time.Millisecond))
	if !r.hasRows {
		why = errors.New("the registry copy in Redis was refused, and nothing is served here yet")
	}
	r.leaveRedis(why)
}

// trusted: the copy read passed, and is the one applied here.
func (r *relay) trusted() {
	r.distrust = time.Time{}
}

// foreign: the copy names another registry than this instance's. Another
// fleet shares the prefix: follow PostgreSQL here, never its registry.
func (r *relay) foreign(name string) {
	relayReads.WithLabelValues(r.zone(), "foreign").Inc()
	r.setRegistryUp(false)
	if name == "" {
		r.warn.Logf("foreign", "Registry relay: the registry copy under the Redis prefix %q names no registry (its follower runs an older pgcluster, or another fleet shares the prefix): following PostgreSQL here meanwhile",
			r.set.redisPrefix)
	} else {
		r.warn.Logf("foreign", "Registry relay: another fleet shares the Redis prefix %q: the registry copy there is of registry %q, this instance's is %q; give each fleet its own redis_prefix. Following PostgreSQL here meanwhile",
			r.set.redisPrefix, clipName(name), r.id.String())
	}
	if r.role == roleReader {
		r.leaveRedis(errors.New("the registry copy in Redis is another registry's"))
	}
}

// sharedPrefix says, once a minute, that the copy a live follower writes
// is not signed with this instance's secret: another fleet with another
// secret shares the prefix, or the fleet's secrets differ.
func (r *relay) sharedPrefix(p lock.CopyPoll, err error) {
	if p.Holder == "" || !errors.Is(err, lock.ErrCopyWronglySigned) && !errors.Is(err, lock.ErrCopyUnsigned) {
		return
	}
	name := "unknown"
	if _, body, ok := strings.Cut(p.Head, " "); ok {
		var h lock.CopyHead
		if json.Unmarshal([]byte(body), &h) == nil && h.Registry != "" {
			name = clipName(h.Registry)
		}
	}
	r.warn.Logf("fleet", "Registry relay: instance %s holds the registry lease under the Redis prefix %q, but the copy it writes (of registry %q) is not signed with this instance's redis_secret: another fleet shares the prefix, or the fleet's secrets differ. Following PostgreSQL here meanwhile",
		short(p.Holder), r.set.redisPrefix, name)
}

// leaveRedis follows PostgreSQL here because the copy was refused, and
// reads Redis again only after a hold, doubled while it keeps happening.
func (r *relay) leaveRedis(why error) {
	if !r.rejoinedAt.IsZero() && time.Since(r.rejoinedAt) < relayHoldMax {
		r.hold = min(2*r.hold, relayHoldMax)
	} else {
		r.hold = relayHold
	}
	r.holdUntil = time.Now().Add(r.hold)
	r.distrust, r.pending = time.Time{}, false
	r.warn.Logf("leave", "Registry relay: %v: following PostgreSQL here for %v at least", why, r.hold)
	r.goLocalQuiet(r.redisNow)
}

// clipName is a registry's name read from Redis, as a log line shows it.
func clipName(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// identify reads the registry's system identifier, until it has it or ctx
// is done, backing off from a second to a minute while PostgreSQL does
// not answer: until then an instance knows its registry by database and
// zones only.
func (r *relay) identify(ctx context.Context) {
	backoff := time.Second
	for {
		sys, err := readSystemID(ctx, r.set.dsn)
		if err == nil {
			select {
			case r.idents <- sys:
			case <-ctx.Done():
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		select {
		case r.idFails <- struct{}{}:
		default:
		}
		r.info.Logf("identify", "Registry relay: cannot read the registry's system identifier yet (%s): a registry copy is checked by database and zones until then", errText(err, r.set.dsn))
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Minute)
	}
}

// awaitingID reports whether no copy is read yet because the registry's
// system identifier is being read: another fleet's copy of a database of
// the same name on another PostgreSQL, under the same prefix, names the
// same database and zones, and only the identifier tells it apart. Its
// first reading takes a connect and a query (milliseconds); one that
// fails (PostgreSQL unreachable) ends the wait, and copies are checked by
// database and zones until it succeeds, as a passive instance's always
// are: the copy is then the fleet's only registry.
func (r *relay) awaitingID() bool {
	return !r.set.passive && r.id.sys == 0 && !r.idFailed
}

// unidentified: the first reading of the registry's system identifier
// failed; a copy is read without it (see awaitingID).
func (r *relay) unidentified() {
	if r.id.sys != 0 || r.idFailed {
		return
	}
	r.idFailed = true
	if r.role == roleReader && r.st.Empty() {
		r.catchUp(false)
	}
}

// learned takes the registry's system identifier: a copy served since
// that names another registry is refused now, and the first copy, which
// waited for it, is read.
func (r *relay) learned(sys uint64) {
	if r.id.sys != 0 {
		return
	}
	r.id.sys = sys
	if r.role == roleReader && r.st.Empty() {
		r.catchUp(false)
		return
	}
	if r.role == roleReader && !r.st.Empty() && !r.id.names(r.st.Registry()) {
		r.foreign(r.st.Registry())
	}
}

// rejoin, in local mode with Redis answering again, reads the registry
// from Redis again once the follower has vouched for a copy of this
// registry since Redis came back and since the last rows read here (and
// any hold is over): until then the copy may lack what this instance read
// itself. An instance that has
// nothing to serve, whose registry session failed, serves the copy
// meanwhile, vetted, even if nobody vouched for it lately: PostgreSQL
// and the follower are gone, and it is the fleet's last registry.
func (r *relay) rejoin(p lock.CopyPoll, h lock.CopyHead, herr error) {
	if r.back.IsZero() {
		r.back = p.Now
	}
	ours := herr == nil && r.id.names(h.Registry)
	if ours && !r.hasRows && r.follow != nil && r.follow.failed.Load() {
		if r.catchUp(true) {
			log.Warningf("Registry relay: PostgreSQL does not answer: serving the registry copy in Redis (version %d, vouched for at %s by Redis's clock) until it does",
				r.st.Version, r.st.Alive().UTC().Format(time.RFC3339))
		}
		return
	}
	if !ours || h.Alive < r.back.UnixMicro() || time.Now().Before(r.holdUntil) {
		return
	}
	if at := r.redisClockAt(r.readHere); !r.readHere.IsZero() && !at.IsZero() && h.Alive < at.UnixMicro() {
		// Vouched for before the rows read here: it may lack them.
		return
	}
	// Read whole: the rows served here are PostgreSQL's, not a version.
	applied := r.st
	r.st = &lock.CopyState{}
	if !r.catchUp(false) {
		r.st, r.distrust = applied, time.Time{}
		return
	}
	r.stopFollowing()
	r.setRole(roleReader)
	r.back, r.rejoinedAt = time.Time{}, time.Now()
	r.info.Logf("rejoin", "Registry relay: Redis answers again: reading the registry from Redis (version %d); this instance no longer follows PostgreSQL", r.st.Version)
}

// renew renews the follower's lease and vouches for the copy while its
// session is up and every change it read is written; gives the lease up
// after relaySessionGrace without a session; checks the copy every refresh, and
// at once when the renewal found it written by someone else.
func (r *relay) renew() {
	f := r.follow
	var alive time.Time
	if r.written && f.up.Load() {
		alive = r.redisNow
	}
	rn, err := r.rc.Renew(r.ctx, r.st, alive, relayLease)
	switch {
	case err != nil:
		r.redisFailed(err)
		return
	case !rn.Held:
		r.lostLease()
		return
	}
	r.redisOK(rn.Now)
	if !f.up.Load() && time.Since(time.Unix(0, f.downSince.Load())) > relaySessionGrace {
		log.Warningf("Registry relay: no registry session for %s: giving the registry lease up for another instance to try", relaySessionGrace)
		if err := r.rc.Release(r.ctx); err != nil {
			r.redisFailed(err)
			return
		}
		r.leaveBy = time.Now().Add(2 * relayLease)
		r.stopFollowing()
		r.setRole(roleReader)
		return
	}
	if !r.written {
		return
	}
	switch {
	case !rn.Intact && !rn.HeadStored:
		// Another version stored: no reader takes this follower's copy
		// until it is written again.
		r.warn.Logf("tamper", "Registry relay: the registry copy in Redis holds a version this follower did not write: writing it whole again")
		r.rewrite()
	case !rn.Intact && time.Since(r.checked) >= relayCheckEvery:
		r.warn.Logf("tamper head", "Registry relay: the registry copy's head in Redis was written by someone else: stored again; checking the copy")
		r.check()
	case time.Since(r.checked) >= r.set.refresh:
		r.check()
	}
}

// check reads the copy whole and writes it again when it is not the one
// written.
func (r *relay) check() {
	r.checked = time.Now()
	err := r.rc.Check(r.ctx, r.st)
	var rej *lock.CopyRejected
	switch {
	case err == nil:
	case errors.Is(err, lock.ErrNoCopy) || errors.Is(err, lock.ErrCopyDiffers) || errors.As(err, &rej):
		r.warn.Logf("check", "Registry relay: the copy in Redis is not the one written (%v): writing it whole again", err)
		r.rewrite()
	default:
		r.redisFailed(err)
	}
}

// rewrite writes the copy whole again, in a term of its own: readers
// that took a forged copy for a newer one take this one. The term is
// Redis's clock, or just after the last one when that is later (by less
// than half a lease: a clock that jumped back further would make every
// later term look ahead of it).
func (r *relay) rewrite() {
	r.checked = time.Now()
	now := r.redisClock().UnixMicro()
	if r.term >= now && r.term < now+relayLease.Microseconds()/2 {
		now = r.term + 1
	}
	r.term = now
	r.termNow.Store(now)
	r.written = false
	r.write(nil, nil, false, false)
}

// becomeFollower starts a term: a fresh registry session, whose first,
// full load is written whole before anything is published.
func (r *relay) becomeFollower(now time.Time) {
	r.stopFollowing()
	r.setRole(roleFollower)
	r.term, r.written, r.back, r.checked = now.UnixMicro(), false, time.Time{}, time.Now()
	r.termNow.Store(r.term)
	r.distrust, r.pending = time.Time{}, false
	log.Infof("Registry relay: took the registry lease as instance %s (%s): following PostgreSQL for the fleet; reloading in full before publishing", short(r.rc.Token()), r.set.instance)
	r.startFollowing()
}

// lostLease: another instance holds the lease now; read from Redis.
func (r *relay) lostLease() {
	r.info.Logf("lost", "Registry relay: the registry lease is another instance's now: reading the registry from Redis")
	r.stopFollowing()
	r.setRole(roleReader)
	r.written = false
	r.catchUp(false)
}

// goLocal follows PostgreSQL here until Redis answers again; now, when
// Redis answers, is its clock.
func (r *relay) goLocal(err error, now time.Time) {
	if r.role == roleLocal {
		return
	}
	if r.set.passive {
		r.stayPassive(err)
		return
	}
	log.Warningf("Registry relay: %v: following PostgreSQL here until Redis serves a copy again", err)
	r.goLocalQuiet(now)
}

// goLocalQuiet is goLocal, its line logged by the caller.
func (r *relay) goLocalQuiet(now time.Time) {
	if r.role == roleLocal {
		return
	}
	if r.set.passive {
		r.stayPassive(errors.New("the registry copy is not fit to serve"))
		return
	}
	if r.role == roleFollower && r.follow != nil {
		// The session goes on; only the copy is behind from now on.
		r.setRole(roleLocal)
	} else {
		r.setRole(roleLocal)
		r.startFollowing()
	}
	r.written, r.back = false, now
}

// stayPassive is goLocal for a passive instance (check passive), which
// reaches no database: it keeps serving the registry as last read from
// Redis, and reads it from there again as soon as it can.
func (r *relay) stayPassive(err error) {
	r.warn.Logf("passive", "Registry relay: %v: serving the registry as last read from Redis (version %d) until Redis serves a copy again: a passive instance reaches no database", err, r.st.Version)
}

func (r *relay) redisOK(now time.Time) {
	if !r.rideUntil.IsZero() {
		r.info.Logf("ride", "Registry relay: Redis answers again after %v: still reading the registry from Redis", time.Since(r.failedAt).Round(time.Millisecond))
	}
	r.fails, r.redisNow, r.redisAt = 0, now, time.Now()
	r.failedAt, r.rideUntil = time.Time{}, time.Time{}
	r.logged["redis"] = nil
}

// redisClock is Redis's clock now, as read last and run on by this host's.
func (r *relay) redisClock() time.Time {
	if r.redisNow.IsZero() {
		return time.Now()
	}
	return r.redisNow.Add(time.Since(r.redisAt))
}

// redisFailed counts a Redis call that failed, and follows PostgreSQL here
// when the follower's write or renewal failed, or relayFailures calls in a
// row did.
func (r *relay) redisFailed(err error) {
	if r.ctx.Err() != nil {
		return
	}
	err = r.dials.Explain(err) // what happened, in the lines that name it
	r.fails++
	if r.fails == 1 {
		r.failedAt = time.Now()
	}
	r.back = time.Time{}
	switch {
	case r.role == roleFollower || r.role == "":
		r.goLocal(err, time.Time{})
	case r.fails < relayFailures:
	case r.set.passive:
		r.stayPassive(err)
	case r.role == roleReader && r.hasRows && r.distrust.IsZero() && r.set.relayGrace > 0:
		r.ride(err)
	default:
		r.goLocal(err, time.Time{})
	}
}

// ride keeps a reader that Redis stopped answering on the copy it serves
// for relay_grace, and then for a random part of another, before it
// follows PostgreSQL itself: a fleet of hundreds that loses Redis for a
// few seconds opens no registry session at all (max_connections is 100 by
// default), and one that loses it for longer opens them spread over a
// grace, not all in the same second. The checks go on meanwhile; what a
// reader misses is only a registry change made during the outage.
func (r *relay) ride(err error) {
	if r.rideUntil.IsZero() {
		g := r.set.relayGrace
		r.rideUntil = r.failedAt.Add(g + rand.N(g))
		r.warn.Logf("ride", "Registry relay: %v: serving the registry as last read from Redis (version %d) for up to %v, then following PostgreSQL here until Redis answers again",
			err, r.st.Version, time.Until(r.rideUntil).Round(time.Second))
		return
	}
	if time.Now().Before(r.rideUntil) {
		return
	}
	r.goLocal(fmt.Errorf("%w (for %v)", err, time.Since(r.failedAt).Round(time.Millisecond)), time.Time{})
}

// fromRegistry takes an update of the registry followed here: written to
// the copy first by the follower, applied here either way.
func (r *relay) fromRegistry(u rowsUpdate) {
	if r.role != roleFollower {
		if len(u.nodes) > 0 || u.aliasesSet || u.networksSet || u.full {
			r.readHere = cmp.Or(u.readAt, u.loadedAt)
		}
		r.apply(u, u.loadedAt)
		return
	}
	changed, aliases, networks := r.rows.diff(u, r.set.staleAfter)
	if r.written && len(changed) == 0 && !aliases && !networks {
		u.version = r.st.Version
		r.apply(u, u.loadedAt)
		return
	}
	r.rows.merge(u, u.loadedAt)
	r.hasRows = true
	r.write(&u, changed, aliases, networks)
}

// write writes the follower's rows to the copy: the clusters changed and,
// with aliases, the aliases, with networks, the networks; everything at a
// term's first write. Then it
// publishes u, when given (the caller merged it into r.rows), with the
// version written. The copy names this
// instance's registry, whose system identifier is read first if it is
// not known yet: a follower that cannot name its registry writes nothing.
func (r *relay) write(u *rowsUpdate, changed map[string]bool, aliases, networks bool) {
	if r.id.sys == 0 {
		sys, err := readSystemID(r.ctx, r.set.dsn)
		if err != nil {
			r.cannotWrite(fmt.Errorf("cannot read the registry's system identifier (%s)", errText(err, r.set.dsn)), u)
			return
		}
		r.id.sys = sys
	}
	full := !r.written
	fields := copyFields(&r.rows, changed, aliases, networks)
	if full {
		fields = allFields(&r.rows)
	}
	w := lock.CopyWrite{Fields: fields, Full: full, Version: r.nextVersion(r.st.Version), Term: r.term, Registry: r.id.String()}
	if u != nil {
		w.Seen = u.readAt
	}
	switch {
	case u != nil && !u.readAt.IsZero() && (r.written || full):
		// Rows read from a session up, with every change read before
		// written: the copy is as fresh as the registry when the read
		// began.
		w.Alive = r.redisClockAt(u.readAt)
	case r.written && r.follow != nil && r.follow.up.Load():
		w.Alive = r.redisNow
	}
	for try := 0; ; try++ {
		res, err := r.rc.Write(r.ctx, r.st, w, relayLease)
		switch {
		case err != nil:
			r.redisFailed(err)
			if u != nil {
				r.publish(*u, u.loadedAt)
			}
			return
		case res.Result == lock.CopyFenced:
			relayWrites.WithLabelValues(r.zone(), "fenced").Inc()
			r.lostLease()
			return
		case res.Result == lock.CopyAhead:
			r.cannotWrite(fmt.Errorf("version %d is ahead of Redis's clock (at most %d): more versions than seconds were written", w.Version, res.Stored), u)
			return
		case res.Result == lock.CopyDiverged && try == 0:
			// Someone else wrote the copy: write it whole, above theirs
			// (a version that is none counts as 0).
			w.Full, w.Fields, w.Version = true, allFields(&r.rows), r.nextVersion(max(res.Stored, r.st.Version))
			continue
		case res.Result == lock.CopyDiverged:
			r.redisFailed(errors.New("the registry copy keeps changing under the follower"))
			return
		}
		r.st, r.written = res.State, true
		result := "delta"
		if w.Full {
			result = "full"
		}
		relayWrites.WithLabelValues(r.zone(), result).Inc()
		if u != nil {
			u.version = w.Version
			r.publish(*u, u.loadedAt)
			if !u.readAt.IsZero() {
				relayLag.WithLabelValues(r.zone()).Observe(time.Since(u.readAt).Seconds())
			}
		}
		return
	}
}

// cannotWrite: the follower cannot write the copy. It follows PostgreSQL
// here (u, when given, applied) and leaves the lease to others for a
// while.
func (r *relay) cannotWrite(why error, u *rowsUpdate) {
	if u != nil {
		r.publish(*u, u.loadedAt)
	}
	if err := r.rc.Release(r.ctx); err != nil {
		r.redisFailed(err)
		return
	}
	r.leaveBy = time.Now().Add(2 * relayLease)
	r.goLocal(fmt.Errorf("the follower cannot write the registry copy: %w", why), r.redisNow)
}

// redisClockAt is Redis's clock at t, a moment on this host's clock.
func (r *relay) redisClockAt(t time.Time) time.Time {
	if r.redisNow.IsZero() {
		return time.Time{}
	}
	return r.redisNow.Add(t.Sub(r.redisAt))
}

// nextVersion is the version after v: at least Redis's Unix time, as
// serials were before the relay, and above the serial served here.
func (r *relay) nextVersion(v int64) int64 {
	n := max(v+1, r.redisClock().Unix())
	if s := r.pb.snap.Load(); s != nil {
		n = max(n, int64(s.serial)+1)
	}
	return n
}

// catchUp reads what changed in the copy since the version applied and
// applies it. It reports whether the copy applied here is now Redis's. A
// copy refused is counted and, for a reader, read again soon (refused);
// with nothing applied from the copy yet, one the follower has not
// vouched for within a lease is not taken either (it may be an old one
// replayed), unless stale (the fallback of an instance with nothing else).
func (r *relay) catchUp(stale bool) bool {
	if r.awaitingID() {
		return false // read once the identifier is known (see learned)
	}
	rd, err := r.rc.Read(r.ctx, r.st)
	var rej *lock.CopyRejected
	switch {
	case err == nil:
	case errors.Is(err, lock.ErrNoCopy):
		r.quiet = time.Now().Add(relayRetry)
		r.info.Logf("no copy", "Registry relay: %v yet: waiting for the follower's first write", err)
		return false
	case errors.Is(err, lock.ErrCopyStale):
		r.refused("stale", err)
		return false
	case errors.As(err, &rej):
		r.refused("rejected", err)
		return false
	default:
		r.redisFailed(err)
		return false
	}
	r.redisOK(rd.Now)
	if !r.id.names(rd.Head.Registry) {
		r.foreign(rd.Head.Registry)
		return false
	}
	if r.st.Empty() && !stale && !vouched(rd.Head, rd.Now) {
		relayReads.WithLabelValues(r.zone(), "stale").Inc()
		r.quiet, r.unvouched = time.Now().Add(relayRetry), true
		r.info.Logf("unvouched", "Registry relay: the registry copy in Redis (version %d) was not vouched for by its follower within %v: not served, waiting for the follower's next renewal",
			rd.Head.Version, relayLease)
		return false
	}
	r.trusted()
	r.registryUp(rd.Head)
	if rd.Fields == nil && !rd.Full {
		r.quiet = time.Now().Add(relayRetry)
		return true
	}
	u, err := updateFromCopy(rd.Fields, rd.Full)
	if err != nil {
		r.refused("rejected", fmt.Errorf("registry copy version %d cannot be read: %w", rd.Head.Version, err))
		return false
	}
	now := time.Now()
	u.loadedAt, u.version = now, rd.Head.Version
	r.st = rd.State
	r.apply(u, now)
	result := "delta"
	if rd.Full {
		result = "full"
	}
	relayReads.WithLabelValues(r.zone(), result).Inc()
	if seen := time.UnixMicro(rd.Head.Seen); rd.Head.Seen > 0 && time.Since(seen) < time.Hour {
		relayLag.WithLabelValues(r.zone()).Observe(max(time.Since(seen), 0).Seconds())
	}
	return true
}

// vouched reports whether the follower vouched for h within a lease of
// now, Redis's clock.
func vouched(h lock.CopyHead, now time.Time) bool {
	return h.Alive > 0 && now.Sub(time.UnixMicro(h.Alive)) <= relayLease
}

// apply merges u into the rows served here and publishes them.
func (r *relay) apply(u rowsUpdate, at time.Time) {
	r.rows.merge(u, at)
	r.publish(u, at)
}

// publish hands the publisher u, already merged into the rows served
// here (as of at), and keeps them for the instance after this one.
//
// The rows are kept before they are answered: an instance that starts
// once an answer was seen here (a Corefile reload) restores them, never
// the rows before.
func (r *relay) publish(u rowsUpdate, at time.Time) {
	r.hasRows = true
	if r.kept {
		lastLoads.keep(r.key, r.rows, at)
	}
	r.pb.applyAt(u)
	registryVersion.WithLabelValues(r.zone()).Set(float64(u.version))
	select {
	case <-r.loaded:
	default:
		close(r.loaded)
	}
}

// registryUp is, for a reader, whether the follower vouched within a
// lease for the copy applied here: its answers follow the registry.
func (r *relay) registryUp(h lock.CopyHead) {
	r.setRegistryUp(vouched(h, r.redisNow) && h.Version == r.st.Version)
}

// setRegistryUp sets a reader's registry_up (a follower's and a local
// instance's is their session's).
func (r *relay) setRegistryUp(up bool) {
	if r.role != roleReader {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	registryUp.WithLabelValues(r.zone()).Set(v)
}

// startFollowing starts a registry session here, fresh: its first load is
// full.
func (r *relay) startFollowing() {
	r.gen++
	ctx, cancel := context.WithCancel(r.ctx)
	f := &relayFollowing{gen: r.gen, cancel: cancel}
	f.downSince.Store(time.Now().UnixNano())
	gen := r.gen
	reg := newRegistry(r.set, "", func(u rowsUpdate) {
		select {
		case r.updates <- relayUpdate{gen, u}:
		case <-ctx.Done():
		}
	})
	reg.served = r.hasRows
	reg.mover = newAliasMover(r.set, r.pb.snap.Load, r.termNow.Load)
	reg.mover.allowed = r.followerNow.Load
	reg.onSession = func(up bool) {
		if !up && f.up.Load() {
			f.downSince.Store(time.Now().UnixNano())
		}
		if !up {
			f.failed.Store(true)
		}
		f.up.Store(up)
	}
	f.reg = reg
	r.follow = f
	go reg.run(ctx)
}

// stopFollowing ends the registry session here, if any, and waits for it.
func (r *relay) stopFollowing() {
	if r.follow == nil {
		return
	}
	r.follow.cancel()
	<-r.follow.reg.done
	r.follow = nil
}

// leave gives the lease up at shutdown, so that another instance takes
// over at once.
func (r *relay) leave() {
	if r.role != roleFollower {
		return
	}
	if err := r.rc.Release(context.Background()); err != nil {
		log.Warningf("Registry relay: %v", r.dials.Explain(err))
	}
}

func (r *relay) setRole(role string) {
	r.role = role
	r.followerNow.Store(role == roleFollower)
	for _, x := range []string{roleFollower, roleReader, roleLocal} {
		v := 0.0
		if x == role {
			v = 1
		}
		relayRole.WithLabelValues(r.zone(), x).Set(v)
	}
}

// logOnce logs a failure of a kind once, until it is another or cleared.
func (r *relay) logOnce(kind string, err error, format string, args ...any) {
	if last := r.logged[kind]; last != nil && last.Error() == err.Error() {
		return
	}
	r.logged[kind] = err
	log.Warningf(format, args...)
}

func (r *relay) zone() string { return r.set.zones[0] }

// short is a token's start, to name an instance in a log line.
func short(token string) string {
	if len(token) > 8 {
		return token[:8]
	}
	if token == "" {
		return "(none yet)"
	}
	return token
}
