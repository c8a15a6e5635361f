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
// the lease on the key still holds the caller's token. It raises the key's
// version, stores status and version together, extends the lease and the
// status's own expiry when asked, and publishes "<version> <len(key)>
// <key><status>" when asked.
//
// The version is the larger of the stored one plus one and Redis's clock in
// microseconds. While the status is stored it only grows; and when Redis
// has lost it (a restart without persistence, a flush), the next version is
// still above every one published before, so subscribers that saw those do
// not drop the new ones as stale. Microseconds stay exact in Lua's numbers
// (below 2^53) until the year 2255; %.0f prints them without an exponent.
//
// KEYS[1] lease, KEYS[2] status; ARGV[1] token, ARGV[2] channel, ARGV[3]
// key, ARGV[4] status, ARGV[5] lease TTL in ms (0: leave it), ARGV[6] "1"
// to publish, ARGV[7] the status's TTL in ms (0: none). Returns the new
// version, or -1 when the lease is not the caller's.
var writeScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local t = redis.call('TIME')
local v = tonumber(t[1]) * 1000000 + tonumber(t[2])
local old = tonumber(redis.call('HGET', KEYS[2], 'v') or '0') or 0
if old + 1 > v then v = old + 1 end
local vs = string.format('%.0f', v)
redis.call('HSET', KEYS[2], 'v', vs, 's', ARGV[4])
if ARGV[7] ~= '0' then redis.call('PEXPIRE', KEYS[2], ARGV[7]) end
if ARGV[5] ~= '0' then redis.call('PEXPIRE', KEYS[1], ARGV[5]) end
if ARGV[6] == '1' then
  redis.call('PUBLISH', ARGV[2], vs .. ' ' .. string.len(ARGV[3]) .. ' ' .. ARGV[3] .. ARGV[4])
end
return v
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
}

// Write stores status for key with the next version, fenced by the lease
// as Publish is, and does what o asks in the same step.
func (l *Leases) Write(ctx context.Context, key string, status []byte, o WriteOptions) (version int64, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	pub := "0"
	if o.Publish {
		pub = "1"
	}
	v, err := writeScript.Run(ctx, l.rdb,
		[]string{leaseKey(l.prefix, key), statusKey(l.prefix, key)},
		l.token, channel(l.prefix), key, status, o.LeaseTTL.Milliseconds(), pub, o.StatusTTL.Milliseconds()).Int64()
	if err != nil {
		return 0, false, fmt.Errorf("lock: write status of %q: %w", key, err)
	}
	if v < 0 {
		return 0, false, nil
	}
	return v, true, nil
}

// errMessage is returned for a published message this package cannot read.
var errMessage = errors.New("lock: malformed status message")

// parseMessage reads a message of publishScript.
func parseMessage(payload string) (key string, version int64, status []byte, err error) {
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
