package lock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// membersSuffix names the sorted set of live instances under a prefix:
// member = token, score = when its membership lapses (Redis time, ms).
const membersSuffix = "members"

func membersKey(prefix string) string { return prefix + membersSuffix }

// heartbeatScript renews the caller's membership for ARGV[2] ms, drops the
// lapsed ones, and returns Redis's time in µs (exact in Lua's numbers until
// the year 2255) and the live members.
var heartbeatScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
return {tonumber(t[1]) * 1000000 + tonumber(t[2]), redis.call('ZRANGE', KEYS[1], 0, -1)}
`)

// Heartbeat renews this instance's membership for ttl and returns the live
// members' tokens (this one's included, in token order) and Redis's clock.
func (l *Leases) Heartbeat(ctx context.Context, ttl time.Duration) (members []string, now time.Time, err error) {
	if err := checkTTL(ttl); err != nil {
		return nil, time.Time{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	res, err := heartbeatScript.Run(ctx, l.rdb, []string{membersKey(l.prefix)}, l.token, ttl.Milliseconds()).Slice()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("lock: heartbeat: %w", err)
	}
	us, ok := res[0].(int64)
	if len(res) != 2 || !ok {
		return nil, time.Time{}, fmt.Errorf("lock: heartbeat: unexpected reply %v", res)
	}
	list, _ := res[1].([]any)
	for _, m := range list {
		if s, ok := m.(string); ok {
			members = append(members, s)
		}
	}
	return members, time.UnixMicro(us), nil
}

// Leave ends this instance's membership at once.
func (l *Leases) Leave(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	if err := l.rdb.ZRem(ctx, membersKey(l.prefix), l.token).Err(); err != nil {
		return fmt.Errorf("lock: leave: %w", err)
	}
	return nil
}

// takeScript takes a free lease, or extends one that is already ours.
var takeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
`)

// TakeAll takes, in one round trip, the leases on keys that are free or
// already ours, for ttl, and returns those it holds now. On error, none is
// reported taken (some may be: they lapse unless renewed).
func (l *Leases) TakeAll(ctx context.Context, keys []string, ttl time.Duration) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	cmds := make([]*redis.Cmd, len(keys))
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = takeScript.Eval(ctx, p, []string{leaseKey(l.prefix, k)}, l.token, ttl.Milliseconds())
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lock: take %d leases: %w", len(keys), err)
	}
	var taken []string
	for i, c := range cmds {
		if n, err := c.Int64(); err == nil && n == 1 {
			taken = append(taken, keys[i])
		}
	}
	return taken, nil
}

// ReleaseAll gives up, in one round trip, the leases on keys that are ours.
func (l *Leases) ReleaseAll(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			releaseScript.Eval(ctx, p, []string{leaseKey(l.prefix, k)}, l.token)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lock: release %d leases: %w", len(keys), err)
	}
	return nil
}
