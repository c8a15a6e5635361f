package pgcluster

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

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
	// relayGrace is how long a follower may go without a registry session
	// before it gives the lease up for another instance to try.
	relayGrace = relayLease
	// relayResync: after a copy is rejected, it is read whole again at most
	// this often, unless its version moves.
	relayResync = 10 * time.Second
	// relayFirstCopy is how long a new instance with nothing to serve
	// waits for a copy before it follows PostgreSQL itself.
	relayFirstCopy = relayLease
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
// other instance reads the changes from the copy and never connects to
// PostgreSQL. The fleet's instances thus serve the same SOA serial, the
// version, for the same rows. A new follower reloads in full and writes
// the copy whole before it publishes. When Redis does not answer, every
// instance follows PostgreSQL itself (local) until Redis answers again and
// the follower vouches for a copy made since.
type relay struct {
	set  *settings
	pb   *publisher
	key  string // of lastLoads; "" keeps nothing
	kept bool
	rdb  redis.UniversalClient
	rc   *lock.RegistryCopy

	updates chan relayUpdate
	polls   chan relayPoll // capacity 1: the poll in flight's result
	news    chan int64     // capacity 1: the version last published, 0 when a subscription began
	loaded  chan struct{}  // closed at the first rows applied
	done    chan struct{}  // closed when run returns

	// Touched only by restore and then run's goroutine.
	ctx      context.Context
	role     string
	rows     rowSet           // the registry as served here
	hasRows  bool             // rows were applied
	st       *lock.CopyState  // the copy as applied here, or as written (follower)
	written  bool             // follower: this term's first, full write is done
	term     int64            // follower: Redis µs when its term began
	redisNow time.Time        // Redis's clock at the last poll or renewal
	fails    int              // Redis calls failed in a row
	back     time.Time        // local: Redis's clock when it answered again
	leaveBy  time.Time        // leave the lease to others until then
	left     time.Duration    // the lease's time to live at the last poll, 0 without one
	started  time.Time        // of run
	checked  time.Time        // follower: when the copy was last checked
	rejected time.Time        // when a copy was last rejected
	rejectV  int64            // the version rejected
	follow   *relayFollowing  // the registry session, while following PostgreSQL here
	gen      int              // of the last relayFollowing
	logged   map[string]error // the last failure of each kind logged
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
	// downSince is when the session was last down (or the registry
	// started), in Unix ns.
	downSince atomic.Int64
}

func newRelay(set *settings, pb *publisher, key string) (*relay, error) {
	rdb, err := newRedisClient(set.redisURL)
	if err != nil {
		return nil, err
	}
	rc, err := lock.NewRegistryCopy(rdb, set.redisPrefix, set.redisSecret)
	if err != nil {
		rdb.Close()
		return nil, err
	}
	return &relay{
		set: set, pb: pb, key: key, rdb: rdb, rc: rc,
		updates: make(chan relayUpdate),
		polls:   make(chan relayPoll, 1),
		news:    make(chan int64, 1),
		loaded:  make(chan struct{}),
		done:    make(chan struct{}),
		st:      &lock.CopyState{},
		logged:  map[string]error{},
	}, nil
}

// restore publishes the rows the instance before this one (same DSN and
// zones, before a Corefile reload) served last, as registry.restore does.
// Call it once, before run.
func (r *relay) restore() bool {
	if r.key == "" {
		return false
	}
	r.kept = true
	last := lastLoads.use(r.key)
	if last == nil {
		return false
	}
	u := rowsUpdate{full: true, nodes: map[string][]Node{}, aliases: last.rows.aliasList(), aliasesSet: true, loadedAt: last.loadedAt}
	for name, c := range last.rows.clusters {
		u.nodes[name] = c.nodes
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
	wctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { r.watch(wctx) })
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
			take := time.Now().After(r.leaveBy)
			polls.Go(func() {
				p, err := r.rc.Poll(ctx, take, relayLease)
				r.polls <- relayPoll{p, err}
			})
		case res := <-r.polls:
			r.polled(res.p, res.err)
			t.Reset(r.nextTick())
		case v := <-r.news:
			// A version rejected is read again only after relayResync:
			// whoever forged it may publish it again and again.
			if r.role == roleReader && v != r.st.Version && (v != r.rejectV || time.Since(r.rejected) >= relayResync) {
				r.catchUp()
			}
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
	switch r.role {
	case roleLocal:
		r.rejoin(p)
	default:
		if r.role == "" {
			r.setRole(roleReader)
			log.Infof("Registry relay: reading the registry from Redis; instance %s follows PostgreSQL for the fleet", short(p.Holder))
		}
		if p.Version != r.st.Version || r.st.Empty() {
			if p.Version != r.rejectV || time.Since(r.rejected) >= relayResync {
				r.catchUp()
			}
		} else {
			r.observeHead(p.Head)
		}
		if !r.hasRows && time.Since(r.started) > relayFirstCopy {
			// No copy fit to serve, and nothing else: the registry itself.
			r.goLocal(errors.New("no registry copy to serve"), p.Now)
		}
	}
}

// rejoin, in local mode with Redis answering again, reads the registry
// from Redis again once the follower has vouched for the copy since Redis
// came back: until then the copy may lack what this instance read itself.
func (r *relay) rejoin(p lock.CopyPoll) {
	if r.back.IsZero() {
		r.back = p.Now
	}
	h, err := r.rc.DecodeHead(p.Head)
	if err != nil || h.Alive < r.back.UnixMicro() {
		return
	}
	// Read whole: the rows served here are PostgreSQL's, not a version.
	applied := r.st
	r.st = &lock.CopyState{}
	if !r.catchUp() {
		r.st = applied
		return
	}
	r.stopFollowing()
	r.setRole(roleReader)
	r.back = time.Time{}
	log.Infof("Registry relay: Redis answers again: reading the registry from Redis (version %d); this instance no longer follows PostgreSQL", r.st.Version)
}

// renew renews the follower's lease and vouches for the copy while its
// session is up and every change it read is written; gives the lease up
// after relayGrace without a session; checks the copy every refresh.
func (r *relay) renew() {
	f := r.follow
	var alive time.Time
	if r.written && f.up.Load() {
		alive = r.redisNow
	}
	now, ok, err := r.rc.Renew(r.ctx, r.st, alive, relayLease)
	switch {
	case err != nil:
		r.redisFailed(err)
		return
	case !ok:
		r.lostLease()
		return
	}
	r.redisOK(now)
	if !f.up.Load() && time.Since(time.Unix(0, f.downSince.Load())) > relayGrace {
		log.Warningf("Registry relay: no registry session for %s: giving the registry lease up for another instance to try", relayGrace)
		if err := r.rc.Release(r.ctx); err != nil {
			r.redisFailed(err)
			return
		}
		r.leaveBy = time.Now().Add(2 * relayLease)
		r.stopFollowing()
		r.setRole(roleReader)
		return
	}
	if r.written && time.Since(r.checked) >= r.set.refresh {
		r.checked = time.Now()
		err := r.rc.Check(r.ctx, r.st)
		var rej *lock.CopyRejected
		switch {
		case err == nil:
		case errors.Is(err, lock.ErrNoCopy) || errors.Is(err, lock.ErrCopyDiffers) || errors.As(err, &rej):
			log.Warningf("Registry relay: the copy in Redis is not the one written (%v): writing it whole again", err)
			r.written = false
			r.write(nil, nil, false)
		default:
			r.redisFailed(err)
		}
	}
}

// becomeFollower starts a term: a fresh registry session, whose first,
// full load is written whole before anything is published.
func (r *relay) becomeFollower(now time.Time) {
	r.stopFollowing()
	r.setRole(roleFollower)
	r.term, r.written, r.back, r.checked = now.UnixMicro(), false, time.Time{}, time.Now()
	log.Infof("Registry relay: took the registry lease: following PostgreSQL for the fleet; reloading in full before publishing")
	r.startFollowing()
}

// lostLease: another instance holds the lease now; read from Redis.
func (r *relay) lostLease() {
	log.Infof("Registry relay: the registry lease is another instance's now: reading the registry from Redis")
	r.stopFollowing()
	r.setRole(roleReader)
	r.written = false
	r.catchUp()
}

// goLocal follows PostgreSQL here until Redis answers again; now, when
// Redis answers, is its clock.
func (r *relay) goLocal(err error, now time.Time) {
	if r.role == roleLocal {
		return
	}
	log.Warningf("Registry relay: %v: following PostgreSQL here until Redis serves a copy again", err)
	if r.role == roleFollower && r.follow != nil {
		// The session goes on; only the copy is behind from now on.
		r.setRole(roleLocal)
	} else {
		r.setRole(roleLocal)
		r.startFollowing()
	}
	r.written, r.back = false, now
}

func (r *relay) redisOK(now time.Time) {
	r.fails, r.redisNow = 0, now
	r.logged["redis"] = nil
}

// redisFailed counts a Redis call that failed, and follows PostgreSQL here
// when the follower's write or renewal failed, or relayFailures calls in a
// row did.
func (r *relay) redisFailed(err error) {
	if r.ctx.Err() != nil {
		return
	}
	r.fails++
	r.back = time.Time{}
	if r.role == roleFollower || r.role == "" || r.fails >= relayFailures {
		r.goLocal(err, time.Time{})
	}
}

// fromRegistry takes an update of the registry followed here: written to
// the copy first by the follower, applied here either way.
func (r *relay) fromRegistry(u rowsUpdate) {
	changed, aliases := r.rows.diff(u, r.set.staleAfter)
	if r.role != roleFollower {
		r.apply(u, u.loadedAt)
		return
	}
	if r.written && len(changed) == 0 && !aliases {
		u.version = r.st.Version
		r.apply(u, u.loadedAt)
		return
	}
	r.rows.merge(u, u.loadedAt)
	r.hasRows = true
	r.write(&u, changed, aliases)
}

// write writes the follower's rows to the copy: the clusters changed and,
// with aliases, the aliases; everything at a term's first write. Then it
// applies u, when given, with the version written.
func (r *relay) write(u *rowsUpdate, changed map[string]bool, aliases bool) {
	full := !r.written
	fields := copyFields(&r.rows, changed, aliases)
	if full {
		fields = allFields(&r.rows)
	}
	w := lock.CopyWrite{Fields: fields, Full: full, Version: r.nextVersion(r.st.Version), Term: r.term}
	if u != nil {
		w.Seen = u.readAt
	}
	if r.written && r.follow != nil && r.follow.up.Load() {
		w.Alive = r.redisNow
	}
	for try := 0; ; try++ {
		res, err := r.rc.Write(r.ctx, r.st, w, relayLease)
		switch {
		case err != nil:
			r.redisFailed(err)
			if u != nil {
				r.apply(*u, u.loadedAt)
			}
			return
		case res.Result == lock.CopyFenced:
			relayWrites.WithLabelValues(r.zone(), "fenced").Inc()
			r.lostLease()
			return
		case res.Result == lock.CopyDiverged && try == 0:
			// Someone else wrote the copy: write it whole, above theirs.
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
			r.apply(*u, u.loadedAt)
			if !u.readAt.IsZero() {
				relayLag.WithLabelValues(r.zone()).Observe(time.Since(u.readAt).Seconds())
			}
		}
		return
	}
}

// nextVersion is the version after v: at least the Unix time, as serials
// were before the relay, and above the serial served here.
func (r *relay) nextVersion(v int64) int64 {
	n := max(v+1, time.Now().Unix())
	if s := r.pb.p.snap.Load(); s != nil {
		n = max(n, int64(s.serial)+1)
	}
	return n
}

// catchUp reads what changed in the copy since the version applied and
// applies it. It reports whether the copy applied here is now Redis's.
func (r *relay) catchUp() bool {
	rd, err := r.rc.Read(r.ctx, r.st)
	var rej *lock.CopyRejected
	switch {
	case err == nil:
	case errors.Is(err, lock.ErrNoCopy):
		r.logOnce("copy", err, "Registry relay: %v yet: waiting for the follower's first write", err)
		return false
	case errors.Is(err, lock.ErrCopyStale):
		relayReads.WithLabelValues(r.zone(), "stale").Inc()
		return false
	case errors.As(err, &rej):
		relayReads.WithLabelValues(r.zone(), "rejected").Inc()
		r.rejected, r.rejectV = time.Now(), rej.Version
		r.logOnce("copy", err, "Registry relay: %v: keeping the zone served", err)
		return false
	default:
		r.redisFailed(err)
		return false
	}
	r.observeHead("")
	r.registryUp(rd.Head)
	if rd.Fields == nil && !rd.Full {
		return true
	}
	u, err := updateFromCopy(rd.Fields, rd.Full)
	if err != nil {
		relayReads.WithLabelValues(r.zone(), "rejected").Inc()
		r.rejected, r.rejectV = time.Now(), rd.Head.Version
		r.logOnce("copy", err, "Registry relay: registry copy version %d cannot be read (%v): keeping the zone served", rd.Head.Version, err)
		return false
	}
	r.logged["copy"] = nil
	now := time.Now()
	u.loadedAt, u.version = now, rd.Head.Version
	r.st = rd.State
	r.apply(u, now)
	result := "delta"
	if rd.Full {
		result = "full"
	}
	relayReads.WithLabelValues(r.zone(), result).Inc()
	if rd.Head.Seen > 0 {
		relayLag.WithLabelValues(r.zone()).Observe(max(time.Since(time.UnixMicro(rd.Head.Seen)), 0).Seconds())
	}
	return true
}

// apply merges u into the rows served here and publishes them.
func (r *relay) apply(u rowsUpdate, at time.Time) {
	r.rows.merge(u, at)
	r.hasRows = true
	r.pb.applyAt(u)
	registryVersion.WithLabelValues(r.zone()).Set(float64(u.version))
	if r.kept {
		lastLoads.keep(r.key, r.rows, at)
	}
	select {
	case <-r.loaded:
	default:
		close(r.loaded)
	}
}

// observeHead sets a reader's registry_up from a head as polled ("": the
// last read's, already set).
func (r *relay) observeHead(raw string) {
	if raw == "" {
		return
	}
	if h, err := r.rc.DecodeHead(raw); err == nil {
		r.registryUp(h)
	}
}

// registryUp is, for a reader, whether the follower vouched for the copy
// within a lease: its answers follow the registry.
func (r *relay) registryUp(h lock.CopyHead) {
	if r.role != roleReader {
		return
	}
	up := 0.0
	if h.Alive > 0 && r.redisNow.Sub(time.UnixMicro(h.Alive)) <= relayLease {
		up = 1
	}
	registryUp.WithLabelValues(r.zone()).Set(up)
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
	reg.onSession = func(up bool) {
		if !up && f.up.Load() {
			f.downSince.Store(time.Now().UnixNano())
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
		log.Warningf("Registry relay: %v", err)
	}
}

func (r *relay) setRole(role string) {
	r.role = role
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
