package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// scanCount is the COUNT hint of each SCAN step of a resync.
const scanCount = 256

// A SCAN step of a read of every status that fails is tried again from
// its cursor (see scan): scanStepTries times in all, scanStepRetry apart.
const (
	scanStepTries = 3
	scanStepRetry = 100 * time.Millisecond
)

// Subscriber applies the statuses published under a prefix, each key's in
// version order, and resynchronises every stored status on each
// (re)subscription and every Resync interval, so that a message lost while
// disconnected costs at most one interval.
type Subscriber struct {
	rdb    redis.UniversalClient
	prefix string
	lat    latency       // the deadlines of its calls
	resync time.Duration // 0: no resync on a timer (a Coordinator reads again by its own rules)
	// OnError, when set, is told of each failed resync and deaf
	// subscription; the subscriber carries on regardless.
	OnError func(error)
	// OnReject, when set, is told of each message and stored status that
	// cannot be read at all (malformed, over MaxStatusBytes, not a hash),
	// with its key when known; it is dropped.
	OnReject func(key string, err error)
	// Horizon, when set, returns the highest version a status can have
	// now (Redis's clock plus the bound, Unix µs). A key's last version
	// above it is forgotten: versions come from Redis's clock, so one
	// further ahead was never written by a holder (it passed vetting by a
	// clock since stepped back, a Redis fail-over to a server whose clock
	// is behind), and it must not make every real one look stale.
	Horizon func() int64
	// Live, when set, receives the newer statuses that arrive as published
	// messages, instead of Subscribe's apply (which still receives those
	// of resyncs): a receiver that tells the two apart, to time how long a
	// status took to arrive for instance.
	Live func(key string, version int64, status []byte)
	// Accept, when set, vets each status and its version before the
	// version counts: one it refuses is dropped without raising the key's
	// last version, so that a forged status, or a replayed one, with a
	// huge version cannot make the real ones stale.
	Accept func(key string, version int64, status []byte) bool
	// OnStale, when set, is told of each published message dropped because
	// its version is not above the key's last one.
	OnStale func(key string)
	// BeforeResync, when set, is asked before each resync whether to do
	// it: false skips it (a receiver that reads by its own rules, as a
	// Coordinator does: it is told of each subscription so).
	BeforeResync func() bool
	// Heard, when set, hears every published message dropped because its
	// version is not above the key's last one: a receiver that counts
	// what it heard from whom (a holder's numbered publishes) hears the
	// others through Accept.
	Heard func(key string, version int64, status []byte)

	now  chan struct{}    // capacity 1: Resync asks for a resync
	last map[string]int64 // highest version applied per key; Subscribe's goroutine only
	// caughtUp is when (Unix ns, our clock) the last marker whose echo
	// came back was published (see CaughtUp).
	caughtUp atomic.Int64
	// counted: PUBLISH of a marker counted a receiver, on a client whose
	// PUBLISH counts every subscription that hears it (not a Cluster
	// client's), so that a count of none is believed (see Subscribe).
	// Subscribe's goroutine only.
	counted bool
	// mark numbers the markers published, markedAt is when the last one
	// was, echoed is the last one whose echo came back: Subscribe's
	// goroutine only. Kept across subscriptions: a marker's echo can
	// come back on the next one.
	mark, echoed uint64
	markedAt     time.Time
}

// marked is what a marker's PUBLISH returned: how many subscriptions
// received marker seq, or why it failed.
type marked struct {
	seq uint64
	n   int64
	err error
}

// NewSubscriber returns a subscriber to the statuses under prefix on rdb,
// resynchronising every resync interval in addition to each subscription.
func NewSubscriber(rdb redis.UniversalClient, prefix string, resync time.Duration) (*Subscriber, error) {
	if err := checkClient(rdb); err != nil {
		return nil, err
	}
	if resync <= 0 {
		return nil, fmt.Errorf("lock: resync interval %v is not positive; give how often every status is re-read", resync)
	}
	return &Subscriber{rdb: rdb, prefix: prefix, resync: resync, now: make(chan struct{}, 1), last: map[string]int64{}}, nil
}

// Resync asks the running Subscribe for a resync soon, without waiting.
func (s *Subscriber) Resync() {
	select {
	case s.now <- struct{}{}:
	default:
	}
}

// echoEvery is how often a subscription checks that it still hears what
// is published: it publishes a marker on a channel of its own and expects
// it back; deafChecks checks in a row with the marker out and nothing
// heard mean the subscription is deaf. Two seconds: a marker queued
// behind large messages (anyone can publish a few of 5 MB) arrives only
// once they are read, which under load takes more than a second, and
// subscribing again would drop them and whatever follows. (The reads of
// every status on a timer used to hold the checks back as well.)
//
// missedMarkers markers in a row whose PUBLISH counted no receiver, on a
// client whose server counted this subscription before, mean it is deaf
// too (see Subscribe): two, since a subscription that go-redis is
// reconnecting by itself (Redis restarted, say) can miss one while it
// subscribes again, and a deaf one is then found within a second.
const (
	echoEvery     = 500 * time.Millisecond
	deafChecks    = 4
	missedMarkers = 2
)

// Subscribe applies statuses until ctx is done, then returns ctx's error.
// apply is called from this goroutine only, once per newer version of a
// key: a message or stored status whose version is not above the last one
// applied for its key is dropped. Subscribe keeps going while Redis is
// unreachable and resynchronises once it is back. A Subscriber runs one
// Subscribe at a time.
//
// A subscription can be alive and deaf: after a Sentinel failover,
// go-redis leaves Pub/Sub connections on the old master, where nothing is
// published any more. So every echoEvery the subscriber publishes a marker
// to itself through the ordinary client (which follows the master); a
// marker out for deafChecks checks while nothing at all was heard or
// waits to be read means subscribing again, which resynchronises. (A
// subscription that hears messages is behind, not deaf: a flood of them
// must not make it drop its backlog.)
//
// Silence takes two seconds to tell, and a subscription left on an old
// master is not always silent: instances not switched yet keep publishing
// there. Redis says it sooner: PUBLISH returns how many subscriptions on
// the server received the message, and this subscription's marker
// channel is its own. So missedMarkers markers in a row that the server
// published to counted no receiver of, once one was counted there (a
// server or proxy that counts none never makes a subscription deaf), also
// mean subscribing again, to the server the ordinary client now reaches.
// Not on Redis Cluster, whose PUBLISH counts the receivers on one node
// only.
func (s *Subscriber) Subscribe(ctx context.Context, apply func(key string, version int64, status []byte)) error {
	echo, err := echoChannel(s.prefix)
	if err != nil {
		return err
	}
	var tick <-chan time.Time
	if s.resync > 0 {
		t := time.NewTicker(s.resync)
		defer t.Stop()
		tick = t.C
	}
	check := time.NewTicker(echoEvery)
	defer check.Stop()
	for {
		if err := s.subscribeOnce(ctx, echo, tick, check.C, apply); err != nil {
			return err
		}
	}
}

// subscribeOnce runs one subscription until ctx is done (its error is
// returned) or the subscription is found deaf (nil: subscribe again).
func (s *Subscriber) subscribeOnce(ctx context.Context, echo string, tick, check <-chan time.Time, apply func(string, int64, []byte)) error {
	ps := s.rdb.Subscribe(ctx, channel(s.prefix), echo)
	defer ps.Close()
	msgs := ps.ChannelWithSubscriptions(
		redis.WithChannelHealthCheckInterval(time.Second),
		redis.WithChannelPingTimeout(CallTimeout),
		redis.WithChannelReconnectTimeout(CallTimeout),
		// go-redis drops a message that waits longer than this for
		// this loop (a minute by default) and delivers the next ones:
		// a loss in the middle of a holder's publishes, which the
		// highest number heard hides (see feed), and a status lost
		// until its holder's next change. A loop that far behind (a
		// fleet starting at once on a loaded machine) holds the
		// delivery instead: Redis buffers what it publishes meanwhile,
		// up to its client-output-buffer-limit for pubsub, then closes
		// the subscription, which subscribes again and reads every
		// status (see resyncAll): lost messages are found, never
		// hidden.
		redis.WithChannelSendTimeout(math.MaxInt64),
	)
	_, cluster := s.rdb.(*redis.ClusterClient)
	// The marker is published by a goroutine of its own, one at a time:
	// a PUBLISH that waits on a slow Redis (for its full deadline) must
	// not hold back the messages that arrive meanwhile, which this loop
	// alone reads.
	published := make(chan marked, 1)
	inFlight := false // a marker's PUBLISH has not returned
	pending := false  // the last marker was published and has not come back
	heard := false    // a message came since the last check
	silent := 0       // checks in a row with a marker out, nothing heard and nothing waiting
	missed := 0       // markers in a row that PUBLISH counted no receiver of (see Subscribe)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick:
			s.resyncAll(ctx, apply)
		case <-s.now:
			s.resyncAll(ctx, apply)
		case <-check:
			if pending && !heard && len(msgs) == 0 {
				silent++
			} else {
				silent = 0
			}
			switch {
			case silent >= deafChecks:
				s.fail(fmt.Errorf("lock: the subscription to %q no longer hears what is published (the master changed?): subscribing again", channel(s.prefix)))
				return nil
			case pending, inFlight:
				// Behind, not deaf (yet): messages came or wait to be
				// read (a flood, which anyone can publish, a large
				// message, a slow resync) ahead of the marker.
				// Subscribing again would drop the backlog and read
				// every status again. Or the marker's PUBLISH waits
				// on Redis, which says nothing of the subscription.
				heard = false
				continue
			}
			heard = false
			s.mark++
			inFlight, s.markedAt = true, time.Now()
			go func(seq uint64) {
				cctx, cancel := s.lat.call(ctx)
				n, err := s.rdb.Publish(cctx, echo, strconv.FormatUint(seq, 10)).Result()
				cancel()
				published <- marked{seq, n, err}
			}(s.mark)
		case r := <-published:
			inFlight = false
			switch {
			case r.err != nil:
				// A marker that cannot be published says nothing of
				// the subscription: Redis is away, and the
				// subscription reconnects by itself.
				pending = false
			case r.n == 0 && s.counted:
				// The server published to, which counted this
				// subscription before, has none now: it is on
				// another server (an old master), and hears nothing
				// published here, whatever it hears there.
				pending = false
				missed++
				if missed >= missedMarkers {
					s.fail(fmt.Errorf("lock: the subscription to %q is not on the server published to (PUBLISH counted no receiver of %d markers in a row; the master changed?): subscribing again", channel(s.prefix), missed))
					return nil
				}
			default:
				// Out, unless its echo came back before PUBLISH
				// returned here.
				pending, missed = s.echoed != r.seq, 0
				s.counted = s.counted || r.n > 0 && !cluster
			}
		case m, ok := <-msgs:
			if !ok {
				return fmt.Errorf("lock: subscription to %q closed", channel(s.prefix))
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" && m.Channel == channel(s.prefix) {
					// First subscription or a reconnect: whatever was
					// published meanwhile is only in the stored statuses.
					s.resyncAll(ctx, apply)
				}
			case *redis.Message:
				heard = true
				if m.Channel == echo {
					// Only the last marker's echo (which may come back
					// on the subscription after the one it was sent
					// on): an earlier one's, late, says nothing of what
					// was published since the last one.
					if seq, err := strconv.ParseUint(m.Payload, 10, 64); err == nil && seq == s.mark && s.echoed != seq {
						s.echoed = seq
						s.caughtUp.Store(s.markedAt.UnixNano())
						pending = false
					}
					continue
				}
				key, v, status, err := parseMessage(m.Payload)
				if err != nil {
					s.reject("", err)
					continue
				}
				if v <= s.lastOf(key) {
					if s.Heard != nil {
						s.Heard(key, v, status)
					}
					if s.OnStale != nil {
						s.OnStale(key)
					}
					continue
				}
				if s.Live != nil {
					s.offer(key, v, status, s.Live)
				} else {
					s.offer(key, v, status, apply)
				}
			}
		}
	}
}

// CaughtUp returns when the last marker whose echo came back was
// published (zero before any): every message published before then has
// been offered (or was lost), since Redis delivers a subscription's
// messages in the order it ran their PUBLISH commands. A message not seen
// by then is not merely late.
func (s *Subscriber) CaughtUp() time.Time {
	if ns := s.caughtUp.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// echoChannel is a channel of this subscriber's own under prefix, for its
// markers.
func echoChannel(prefix string) (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("lock: cannot draw a random channel name: %w", err)
	}
	return prefix + "echo:" + hex.EncodeToString(b), nil
}

// offer applies a status if its version is newer than the key's last one
// and Accept does not refuse it.
func (s *Subscriber) offer(key string, v int64, status []byte, apply func(string, int64, []byte)) {
	if v <= s.lastOf(key) {
		return
	}
	if s.Accept != nil && !s.Accept(key, v, status) {
		return
	}
	s.last[key] = v
	apply(key, v, status)
}

// lastOf is the last version applied for key, 0 when none or when it is
// beyond the Horizon.
func (s *Subscriber) lastOf(key string) int64 {
	v, ok := s.last[key]
	if ok && s.Horizon != nil && v > s.Horizon() {
		delete(s.last, key)
		return 0
	}
	return v
}

func (s *Subscriber) reject(key string, err error) {
	if s.OnReject != nil {
		s.OnReject(key, err)
	}
}

func (s *Subscriber) fail(err error) {
	if s.OnError != nil {
		s.OnError(err)
	}
}

// Stored is a status as stored in Redis.
type Stored struct {
	Key     string
	Version int64
	Status  []byte
	// Err says why the status could not be read at all (over
	// MaxStatusBytes, not a hash, no version): Version and Status are
	// then empty.
	Err error
}

// resyncAll reads every stored status and offers it. What was read is
// offered even when the read did not complete: versions keep it safe.
func (s *Subscriber) resyncAll(ctx context.Context, apply func(string, int64, []byte)) {
	if s.BeforeResync != nil && !s.BeforeResync() {
		return
	}
	all, err := s.ReadAll(ctx)
	if err != nil {
		s.fail(err)
	}
	for _, st := range all {
		if st.Err != nil {
			s.reject(st.Key, st.Err)
			continue
		}
		s.offer(st.Key, st.Version, st.Status, apply)
	}
}

// ReadAll reads every status stored under the prefix, each Redis call
// bounded by the subscriber's deadline (see latency); on Redis Cluster it
// scans every master. On error it returns what it read before it. A status
// key that cannot be read (a status over MaxStatusBytes, which is not
// read; a key that is not a hash; a version that is not a number) is
// returned with its Err, and does not stop the read.
func (s *Subscriber) ReadAll(ctx context.Context) ([]Stored, error) {
	var (
		mu  sync.Mutex // ForEachMaster reads the masters concurrently
		all []Stored
	)
	err := s.scan(ctx, 0, func(got []Stored) {
		mu.Lock()
		defer mu.Unlock()
		all = append(all, got...)
	})
	return all, err
}

// scan reads every status stored under the prefix a SCAN step at a time,
// each step bounded by the subscriber's deadline and handed to page as it
// is read (from a goroutine per master on Redis Cluster, concurrently),
// with pause between steps: a read paced so that it does not take Redis
// from the fleet's other calls. A step that fails is tried again from its
// cursor, up to scanStepTries times in all, scanStepRetry apart: a read
// of ten thousand statuses is forty steps, and on a loaded machine one of
// them misses its deadline now and then; begun again from the start a
// cycle later, such a read may never complete, and until the read a
// subscription calls for completes, nothing any holder wrote is
// confirmed (see confirm). On error it returns after the pages read
// before it.
func (s *Subscriber) scan(ctx context.Context, pause time.Duration, page func([]Stored)) error {
	read := func(ctx context.Context, c redis.UniversalClient) error {
		var cursor uint64
		for {
			var next uint64
			var err error
			for try := 1; ; try++ {
				cctx, cancel := s.lat.call(ctx)
				var names []string
				names, next, err = c.Scan(cctx, cursor, statusPattern(s.prefix), scanCount).Result()
				if err == nil {
					var got []Stored
					got, err = readStatuses(cctx, c, s.prefix, names)
					page(got)
				}
				cancel()
				if err == nil || try == scanStepTries || ctx.Err() != nil {
					break
				}
				if sleep(ctx, scanStepRetry) != nil {
					break
				}
			}
			if err != nil {
				return err
			}
			if next == 0 {
				return nil
			}
			cursor = next
			if pause > 0 {
				if err := sleep(ctx, pause); err != nil {
					return err
				}
			}
		}
	}
	var err error
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return read(ctx, c) })
	} else {
		err = read(ctx, s.rdb)
	}
	if err != nil {
		return fmt.Errorf("lock: resync of the statuses under %q: %w", s.prefix, err)
	}
	return nil
}

// readKeys reads the stored statuses of keys, scanCount at a time, each
// step bounded by the subscriber's deadline and handed to page as it is
// read. On error it returns after the pages read before it.
func (s *Subscriber) readKeys(ctx context.Context, keys []string, page func([]Stored)) error {
	for chunk := range slices.Chunk(keys, scanCount) {
		names := make([]string, len(chunk))
		for i, k := range chunk {
			names[i] = statusKey(s.prefix, k)
		}
		cctx, cancel := s.lat.call(ctx)
		got, err := readStatuses(cctx, s.rdb, s.prefix, names)
		cancel()
		page(got)
		if err != nil {
			return fmt.Errorf("lock: read %d statuses under %q: %w", len(keys), s.prefix, err)
		}
	}
	return nil
}

// sleep waits for d, or returns ctx's error when it ends first.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// readScript reads a status key's version and status, the status only
// when it is at most ARGV[1] bytes: {v, s}, or {v, false, its size} when
// it is larger (so that anyone's huge status costs Redis's memory, not
// the reader's), or {false, false, -1} for a key that is not a hash. Only
// HMGET, which the fleet's ACL user has anyway.
var readScript = redis.NewScript(`
local r = redis.pcall('HMGET', KEYS[1], 'v', 's')
if r.err then return {false, false, -1} end
if r[2] and string.len(r[2]) > tonumber(ARGV[1]) then
  return {r[1], false, string.len(r[2])}
end
return {r[1], r[2]}
`)

// readStatuses reads the status keys names in one round trip, each with
// readScript: version and status together, a status over MaxStatusBytes
// not at all.
func readStatuses(ctx context.Context, c redis.UniversalClient, prefix string, names []string) ([]Stored, error) {
	var keys []string
	var calls []scriptCall
	for _, n := range names {
		key, ok := keyOfStatus(prefix, n)
		if !ok {
			continue
		}
		keys = append(keys, key)
		calls = append(calls, scriptCall{keys: []string{n}, args: []any{MaxStatusBytes}})
	}
	cmds, err := evalEach(ctx, c, readScript, calls)
	if err != nil && !replyError(err) {
		return nil, err
	}
	var out []Stored
	for i, cmd := range cmds {
		res, err := cmd.Slice()
		if err != nil && !replyError(err) {
			return out, err
		}
		if err != nil || len(res) < 2 {
			continue
		}
		v, ok1 := res[0].(string)
		st, ok2 := res[1].(string)
		var size int64
		if len(res) == 3 {
			size, _ = res[2].(int64)
		}
		switch version, err := strconv.ParseInt(v, 10, 64); {
		case size < 0:
			out = append(out, Stored{Key: keys[i], Err: refuse(refusedMalformed, "the key is not a hash")})
		case size > 0 || len(st) > MaxStatusBytes:
			out = append(out, Stored{Key: keys[i], Err: refuse(refusedLarge, "%d bytes, over %d", max(size, int64(len(st))), MaxStatusBytes)})
		case !ok1 || !ok2:
			// Deleted meanwhile, or half written by someone else.
		case err != nil || version < 1:
			out = append(out, Stored{Key: keys[i], Err: refuse(refusedMalformed, "version %s", quoteRedis(v))})
		default:
			out = append(out, Stored{Key: keys[i], Version: version, Status: []byte(st)})
		}
	}
	return out, nil
}

// replyError reports whether err is Redis's reply to a command (a key of
// the wrong type, say), not a failure to reach it.
func replyError(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && !errors.Is(err, context.DeadlineExceeded)
}
