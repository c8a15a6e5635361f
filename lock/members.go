package lock

import (
	"context"
	"crypto/hmac"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// membersSuffix names the sorted set of live instances under a prefix:
// member = the instance's entry (its token, signed with the secret when
// there is one: see memberEntry), score = when its membership lapses
// (Redis time, ms).
const membersSuffix = "members"

func membersKey(prefix string) string { return prefix + membersSuffix }

// maxMembers bounds the members a heartbeat reads: a fleet has a few
// dozen; whoever adds thousands must not make every heartbeat carry them.
const maxMembers = 1000

// maxMemberEntry bounds a member entry: a token and its signature are
// under 100 bytes.
const maxMemberEntry = 256

// memberSep separates a token from its signature in a member entry.
const memberSep = "."

// memberEntry is what this instance adds to the members set: its token,
// and with a secret its HMAC, keyed to the prefix so that a member of
// another fleet with the same secret does not count here either.
func (l *Leases) memberEntry() string {
	if len(l.secret) == 0 {
		return l.token
	}
	return l.token + memberSep + hex.EncodeToString(mac(l.secret, "member "+l.prefix, []byte(l.token)))
}

// memberToken returns the token of a member entry read from Redis, or why
// it does not count: too long, or, with a secret, without the signature
// the secret makes for its token. Without a secret, a signature is not
// checked.
func memberToken(entry, prefix string, secret []byte) (string, error) {
	if len(entry) > maxMemberEntry {
		return "", refuse(refusedLarge, "member entry of %d bytes, over %d", len(entry), maxMemberEntry)
	}
	token, sig, signed := strings.Cut(entry, memberSep)
	if token == "" {
		return "", refuse(refusedMalformed, "member entry %s without a token", quoteRedis(entry))
	}
	if len(secret) == 0 {
		return token, nil
	}
	if !signed {
		return "", refuse(refusedUnsigned, "member %s has no signature, and redis_secret is set", quoteRedis(token))
	}
	if !hmac.Equal([]byte(sig), []byte(hex.EncodeToString(mac(secret, "member "+prefix, []byte(token))))) {
		return "", refuse(refusedSignature, "member %s is not signed with the secret", quoteRedis(token))
	}
	return token, nil
}

// heartbeatScript renews the caller's membership for ARGV[2] ms, drops the
// lapsed members and those whose membership would last more than ARGV[3]
// ms from now (no instance writes that: a member TTL is below a lease, so
// such a score is anyone's write, and would count for good), and returns
// Redis's time in µs (exact in Lua's numbers until the year 2255) and at
// most ARGV[4] members. A members key of another type is anyone's write:
// it is dropped rather than making every heartbeat fail.
var heartbeatScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if type(redis.pcall('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])) == 'table' then
  redis.call('DEL', KEYS[1])
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. now)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '(' .. (now + tonumber(ARGV[3])), '+inf')
return {tonumber(t[1]) * 1000000 + tonumber(t[2]), redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[4]) - 1)}
`)

// Membership is what a heartbeat read of the fleet.
type Membership struct {
	// Members are the live members' tokens that passed vetting (this
	// instance's included), in token order.
	Members []string
	// Refused holds why each entry that did not pass was refused.
	Refused []error
	// Now is Redis's clock.
	Now time.Time
}

// Heartbeat renews this instance's membership for ttl, drops the entries
// that would last more than ahead, and returns the live members and
// Redis's clock.
func (l *Leases) Heartbeat(ctx context.Context, ttl, ahead time.Duration) (Membership, error) {
	if err := checkTTL(ttl); err != nil {
		return Membership{}, err
	}
	ctx, done := l.call(ctx)
	defer done()
	res, err := heartbeatScript.Run(ctx, l.rdb, []string{membersKey(l.prefix)}, l.memberEntry(), ttl.Milliseconds(),
		max(ahead, ttl).Milliseconds(), maxMembers).Slice()
	if err != nil {
		return Membership{}, fmt.Errorf("lock: heartbeat: %w", err)
	}
	if len(res) != 2 {
		return Membership{}, fmt.Errorf("lock: heartbeat: unexpected reply %v", res)
	}
	us, ok := res[0].(int64)
	if !ok {
		return Membership{}, fmt.Errorf("lock: heartbeat: unexpected reply %v", res)
	}
	m := Membership{Now: time.UnixMicro(us)}
	list, _ := res[1].([]any)
	for _, e := range list {
		s, _ := e.(string)
		tok, err := memberToken(s, l.prefix, l.secret)
		if err != nil {
			m.Refused = append(m.Refused, err)
			continue
		}
		m.Members = append(m.Members, tok)
	}
	slices.Sort(m.Members)
	m.Members = slices.Compact(m.Members)
	return m, nil
}

// Leave ends this instance's membership at once.
func (l *Leases) Leave(ctx context.Context) error {
	ctx, done := l.call(ctx)
	defer done()
	if err := l.rdb.ZRem(ctx, membersKey(l.prefix), l.memberEntry()).Err(); err != nil {
		return fmt.Errorf("lock: leave: %w", err)
	}
	return nil
}

// takeScript takes a free lease, or extends one that is already ours. A
// lease that has no TTL, or whose TTL is above ARGV[3] ms (no instance
// sets one: a lease is renewed to its TTL), or, when ARGV[4] is "1", that
// holds no live instance's token (ARGV[5...]: the members the caller's
// heartbeat just read), is void: anyone's write, which would keep the
// key's rightful holder out for good. It is taken too, and 2 returned. A
// lease key of another type is void as well (SET replaces any type).
var takeScript = redis.NewScript(`
local v = redis.pcall('GET', KEYS[1])
if v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if type(v) == 'string' then
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left <= tonumber(ARGV[3]) then
    if ARGV[4] ~= '1' then return 0 end
    for i = 5, #ARGV do
      if ARGV[i] == v then return 0 end
    end
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 2
`)

// TakeAll takes, in one round trip, the leases on keys that are free,
// already ours, or void (see takeScript: without a TTL or with one over
// twice ttl, or, for the keys of vetMembers, held by none of live), for
// ttl, and returns those it holds now and, of those, the ones that were
// void. On error, none is reported taken (some may be: they lapse unless
// renewed).
//
// A holder missing from live is void only for the keys of vetMembers:
// those the caller failed to take a round ago already. An instance that
// joined since the caller's heartbeat may have taken a key at once; by
// the next round the caller knows it.
func (l *Leases) TakeAll(ctx context.Context, keys []string, ttl time.Duration, live []string, vetMembers map[string]bool) (taken, void []string, err error) {
	if len(keys) == 0 {
		return nil, nil, nil
	}
	if err := checkTTL(ttl); err != nil {
		return nil, nil, err
	}
	ctx, done := l.call(ctx)
	defer done()
	trust := []any{l.token, ttl.Milliseconds(), 2 * ttl.Milliseconds(), "0"}
	vet := make([]any, 0, 4+len(live))
	vet = append(vet, l.token, ttl.Milliseconds(), 2*ttl.Milliseconds(), "1")
	for _, m := range live {
		vet = append(vet, m)
	}
	cmds := make([]*redis.Cmd, len(keys))
	_, err = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			args := trust
			if vetMembers[k] {
				args = vet
			}
			cmds[i] = takeScript.Eval(ctx, p, []string{leaseKey(l.prefix, k)}, args...)
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("lock: take %d leases: %w", len(keys), err)
	}
	for i, c := range cmds {
		switch n, err := c.Int64(); {
		case err != nil:
		case n == 1:
			taken = append(taken, keys[i])
		case n == 2:
			taken = append(taken, keys[i])
			void = append(void, keys[i])
		}
	}
	return taken, void, nil
}

// SeizeAll takes, in one round trip, the leases on keys for ttl whoever
// holds them: for keys whose holder kept them from their owner for longer
// than any holder keeps a key the fleet moved away from it.
func (l *Leases) SeizeAll(ctx context.Context, keys []string, ttl time.Duration) error {
	if len(keys) == 0 {
		return nil
	}
	if err := checkTTL(ttl); err != nil {
		return err
	}
	ctx, done := l.call(ctx)
	defer done()
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range keys {
			p.Set(ctx, leaseKey(l.prefix, k), l.token, ttl)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("lock: seize %d leases: %w", len(keys), err)
	}
	return nil
}

// ReleaseAll gives up, in one round trip, the leases on keys that are ours.
func (l *Leases) ReleaseAll(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	ctx, done := l.call(ctx)
	defer done()
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
