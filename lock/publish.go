package lock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// writeScript writes a status, fenced by the lease: nothing happens unless
// the lease on the key still holds the caller's token. It stores status and
// version together, extends the lease and the status's own expiry when
// asked, and publishes "<version> <len(key)> <key><status>" when asked.
//
// A version is Redis's clock in microseconds, bounded by it: the stored
// version counts only while it is below Redis's clock plus ahead (ARGV[9],
// µs), and the new one must be above the stored one and not past that
// bound. A stored version that is not a number, or is further ahead (which
// no writer made: anyone who can write to Redis can), is treated as absent,
// so that the writer starts again from Redis's clock rather than from it:
// the versions stay below 2^53, where Lua's numbers are exact (until the
// year 2255), and always move. While the status is stored, versions only
// grow; when Redis has lost it (a restart without persistence, a flush),
// the next version, from Redis's clock, is still above every one published
// before it (an earlier clock), so subscribers that saw those do not drop
// the new ones as stale.
//
// The writer proposes the version (ARGV[8]), which its status signs; 0
// lets the script choose the next one (an opaque status that does not carry
// it). A proposal out of bounds is not written: the script returns the
// version to propose instead, the larger of the stored one plus one and
// Redis's clock. A key of another type than the script writes (a lease
// that is not a string, a status that is not a hash) is anyone's write,
// and is treated as absent too, so that it cannot make the script fail.
//
// A writer that rewrites its status without publishing it (nothing
// changed) names the version it last stored (ARGV[10]): a stored version
// that is not it means someone else wrote or deleted the status, and
// whoever read theirs must hear the writer's, so it is published after
// all.
//
// The status's own expiry (ARGV[7]) is set at every write unless ARGV[11]
// names a period: then only when the write creates the status (none
// stored, or one treated as absent) and when its version enters a new
// period, so that a status rewritten at every probe costs one command
// less per write, and one its writers left still expires within the TTL
// plus a period of its last write.
//
// KEYS[1] lease, KEYS[2] status; ARGV[1] token, ARGV[2] channel, ARGV[3]
// key, ARGV[4] status, ARGV[5] lease TTL in ms (0: leave it), ARGV[6] "1"
// to publish, ARGV[7] the status's TTL in ms (0: none), ARGV[8] the
// proposed version (0: choose), ARGV[9] ahead in µs, ARGV[10] the version
// the writer last stored (0: unknown), ARGV[11] the period of the
// status's expiry in µs (0: every write). Returns {1, version, 1 when
// published} when written, {0, version to propose, 0} when the proposal
// is refused, {-1, 0, 0} when the lease is not the caller's.
var writeScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
if redis.pcall('GET', KEYS[1]) ~= ARGV[1] then
  return {-1, 0, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit = now + tonumber(ARGV[9])
local old = redis.pcall('HGET', KEYS[2], 'v')
if type(old) == 'table' then
  redis.call('DEL', KEYS[2])
  old = nil
end
old = tonumber(old or '')
if old ~= nil and not (old >= 0 and old < limit) then old = nil end
local next = now
if old ~= nil and old + 1 > next then next = old + 1 end
local v = tonumber(ARGV[8])
if v == 0 then
  v = next
elseif not (v > (old or 0) and v <= limit) then
  return {0, next, 0}
end
local pub = ARGV[6] == '1'
local expect = tonumber(ARGV[10])
if expect ~= 0 and old ~= expect then pub = true end
local vs = string.format('%.0f', v)
redis.call('HSET', KEYS[2], 'v', vs, 's', ARGV[4])
local every = tonumber(ARGV[11])
if ARGV[7] ~= '0' and (every == 0 or old == nil or math.floor(v / every) ~= math.floor(old / every)) then
  redis.call('PEXPIRE', KEYS[2], ARGV[7])
end
if ARGV[5] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[5]) end
if pub then
  redis.call('PUBLISH', ARGV[2], vs .. ' ' .. string.len(ARGV[3]) .. ' ' .. ARGV[3] .. ARGV[4])
  return {1, v, 1}
end
return {1, v, 0}
`)

// Publish stores status for key with the next version and publishes it, in
// one step, only while this instance holds the lease on key. ok is false,
// and nothing is written, when the lease has lapsed or another instance
// has taken it.
func (l *Leases) Publish(ctx context.Context, key string, status []byte) (version int64, ok bool, err error) {
	return l.Write(ctx, key, status, WriteOptions{Publish: true})
}

// WriteOptions say what Write does besides storing the status.
type WriteOptions struct {
	Publish   bool          // publish the status to subscribers
	LeaseTTL  time.Duration // > 0: extend the lease to this from now
	StatusTTL time.Duration // > 0: the stored status expires this long after its last write
	// StatusTTLEvery, with StatusTTL, sets the status's expiry only
	// when the write creates it and when its version (µs) enters a new
	// period of this length, not at every write: it then expires
	// between StatusTTL and StatusTTL + StatusTTLEvery after its last
	// write. 0: at every write.
	StatusTTLEvery time.Duration
	// Ahead bounds versions: a stored version further ahead of Redis's
	// clock is treated as absent, and none is written past it. 0 is
	// defaultAhead.
	Ahead time.Duration
	// Expect, when > 0, is the version this writer last stored: when the
	// stored one is another (someone else wrote or deleted the status),
	// the status is published even without Publish, so that whoever read
	// the other hears this writer's.
	Expect int64
}

// defaultAhead is WriteOptions.Ahead's default: a lease's at the least.
const defaultAhead = time.Second

// writeTries bounds the proposals of one WriteVersioned: the script
// answers a refused one with the version to propose, so a second is
// refused only when another write came in between.
const writeTries = 3

// Write stores status for key with the next version, fenced by the lease
// as Publish is, and does what o asks in the same step.
func (l *Leases) Write(ctx context.Context, key string, status []byte, o WriteOptions) (version int64, ok bool, err error) {
	return l.WriteVersioned(ctx, key, 0, func(int64) []byte { return status }, o)
}

// WriteVersioned stores, fenced by the lease as Write does, the status
// body returns for its version: propose, unless Redis refuses it (it is
// not above the stored version, or is beyond Redis's clock plus o.Ahead),
// then the version Redis proposes instead. propose 0 lets Redis choose.
// It returns the version written.
func (l *Leases) WriteVersioned(ctx context.Context, key string, propose int64, body func(version int64) []byte, o WriteOptions) (version int64, ok bool, err error) {
	w, err := l.writeVersioned(ctx, key, propose, body, o)
	return w.version, w.ok, err
}

// written is what a status write did: stored (ok) with version, and
// published or not.
type written struct {
	version   int64
	ok        bool
	published bool
}

// writeVersioned is WriteVersioned, saying whether the status was
// published (asked, or because the stored version was not o.Expect).
func (l *Leases) writeVersioned(ctx context.Context, key string, propose int64, body func(version int64) []byte, o WriteOptions) (written, error) {
	ctx, done := l.call(ctx)
	defer done()
	pub := "0"
	if o.Publish {
		pub = "1"
	}
	ahead := o.Ahead
	if ahead <= 0 {
		ahead = defaultAhead
	}
	v := max(propose, 0)
	for range writeTries {
		res, err := writeScript.Run(ctx, l.rdb,
			[]string{leaseKey(l.prefix, key), statusKey(l.prefix, key)},
			l.token, channel(l.prefix), key, body(v), o.LeaseTTL.Milliseconds(), pub, o.StatusTTL.Milliseconds(),
			v, ahead.Microseconds(), max(o.Expect, 0), max(o.StatusTTLEvery.Microseconds(), 0)).Int64Slice()
		if err != nil {
			return written{}, fmt.Errorf("lock: write status of %q: %w", key, err)
		}
		if len(res) != 3 {
			return written{}, fmt.Errorf("lock: write status of %q: unexpected reply %v", key, res)
		}
		switch res[0] {
		case 1:
			return written{version: res[1], ok: true, published: res[2] == 1}, nil
		case -1:
			return written{}, nil
		}
		v = res[1]
	}
	return written{}, fmt.Errorf("%w: status of %q, last proposed version %d", errContended, key, v)
}

// confirm counts seq, a number this instance gave a publish, as one Redis
// confirmed published: the watermark its next heartbeat stores is the
// highest such number. A publish whose write failed or whose reply was
// lost is not counted: the watermark never names a number nobody heard.
func (l *Leases) confirm(seq uint64) {
	for {
		s := l.sent.Load()
		if seq <= s || l.sent.CompareAndSwap(s, seq) {
			return
		}
	}
}

// errContended: each version proposed was refused, because the stored
// version moved between the tries. Only a writer without the lease does
// that: this is no failure of Redis.
var errContended = errors.New("lock: the stored version moved under every proposal: someone writes the status without the lease")

// errMessage is returned for a published message this package cannot read.
var errMessage = refuse(refusedMalformed, "a message that is not <version> <key length> <key><status>")

// maxMessage bounds a published message: a status, its key and version.
const maxMessage = MaxStatusBytes + 1024

// parseMessage reads a message of writeScript. One over maxMessage is
// refused before anything else.
func parseMessage(payload string) (key string, version int64, status []byte, err error) {
	if len(payload) > maxMessage {
		return "", 0, nil, refuse(refusedLarge, "message of %d bytes, over %d", len(payload), maxMessage)
	}
	vs, rest, ok := strings.Cut(payload, " ")
	if !ok {
		return "", 0, nil, errMessage
	}
	ls, rest, ok := strings.Cut(rest, " ")
	if !ok {
		return "", 0, nil, errMessage
	}
	version, err = strconv.ParseInt(vs, 10, 64)
	if err != nil || version < 1 {
		return "", 0, nil, errMessage
	}
	n, err := strconv.Atoi(ls)
	if err != nil || n < 0 || n > len(rest) {
		return "", 0, nil, errMessage
	}
	return rest[:n], version, []byte(rest[n:]), nil
}
