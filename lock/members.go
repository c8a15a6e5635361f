package lock

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/printable"
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

// maxWatermark bounds a watermark entry: a number and its signature are
// under 100 bytes.
const maxWatermark = 128

// watermarkEntry is what this instance stores as its watermark: sent, and
// with a secret its HMAC over the token and sent, keyed to the prefix, so
// that no watermark counts for a member unless that member wrote it.
func (l *Leases) watermarkEntry(sent uint64) string {
	w := strconv.FormatUint(sent, 10)
	if len(l.secret) == 0 {
		return w
	}
	return w + memberSep + hex.EncodeToString(mac(l.secret, "watermark "+l.prefix, []byte(l.token+" "+w)))
}

// watermarkOf returns the watermark of token read from Redis, or why it
// does not count: too long, not a number, or, with a secret, without the
// signature the secret makes for the token and the number.
func watermarkOf(entry, token, prefix string, secret []byte) (uint64, error) {
	if len(entry) > maxWatermark {
		return 0, refuse(refusedLarge, "watermark of member %s of %d bytes, over %d", quoteRedis(token), len(entry), maxWatermark)
	}
	w, sig, signed := strings.Cut(entry, memberSep)
	n, err := strconv.ParseUint(w, 10, 64)
	if err != nil {
		return 0, refuse(refusedMalformed, "watermark of member %s: %s", quoteRedis(token), quoteRedis(entry))
	}
	if len(secret) == 0 {
		return n, nil
	}
	if !signed {
		return 0, refuse(refusedUnsigned, "watermark of member %s has no signature, and redis_secret is set", quoteRedis(token))
	}
	if !hmac.Equal([]byte(sig), []byte(hex.EncodeToString(mac(secret, "watermark "+prefix, []byte(token+" "+w))))) {
		return 0, refuse(refusedSignature, "watermark of member %s is not signed with the secret", quoteRedis(token))
	}
	return n, nil
}

// heartbeatScript renews the caller's membership for ARGV[2] ms, drops the
// lapsed members and those whose membership would last more than ARGV[3]
// ms from now (no instance writes that: a member TTL is below a lease, so
// such a score is anyone's write, and would count for good), stores the
// caller's watermark ARGV[5] in the hash KEYS[2] and its name ARGV[6] in
// the hash KEYS[3] (none when empty), drops the others' fields of members
// no longer live from both (when a hash holds more fields than live
// members could have written), and returns Redis's time in µs (exact in
// Lua's numbers until the year 2255), at most ARGV[4] members and their
// watermarks (false where a member stored none). A members key or hash of
// another type is anyone's write: it is dropped rather than making every
// heartbeat fail, and so is a hash grown past twice the members any
// heartbeat reads (anyone's fields), which every member writes again at
// its next heartbeat.
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
local live = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[4]) - 1)
local function keep(key, value)
  if value == '' then
    redis.pcall('HDEL', key, ARGV[1])
  elseif type(redis.pcall('HSET', key, ARGV[1], value)) == 'table' then
    redis.call('DEL', key)
    redis.call('HSET', key, ARGV[1], value)
  end
  local n = redis.pcall('HLEN', key)
  local fair = #live
  if value == '' then fair = fair - 1 end
  if type(n) ~= 'number' then
    redis.call('DEL', key)
  elseif n > 2 * tonumber(ARGV[4]) then
    redis.call('DEL', key)
    if value ~= '' then redis.call('HSET', key, ARGV[1], value) end
  elseif n > fair then
    local live_set = {}
    for _, m in ipairs(live) do live_set[m] = true end
    for _, f in ipairs(redis.call('HKEYS', key)) do
      if not live_set[f] then redis.call('HDEL', key, f) end
    end
  end
end
keep(KEYS[2], ARGV[5])
keep(KEYS[3], ARGV[6])
local marks = {}
if #live > 0 then marks = redis.call('HMGET', KEYS[2], unpack(live)) end
return {tonumber(t[1]) * 1000000 + tonumber(t[2]), live, marks}
`)

// maxMemberName bounds a member's name (its host and DNS listener) as
// stored: longer names are cut to it, and a stored name over it (with its
// signature) is anyone's write.
const maxMemberName = 200

// nameEntry is what this instance stores as its name: the name, and with
// a secret its HMAC over the token and the name, keyed to the prefix, so
// that no name is shown for a member unless that member wrote it. "" when
// the instance has no name.
func (l *Leases) nameEntry() string {
	if l.name == "" || len(l.secret) == 0 {
		return l.name
	}
	return l.name + memberSep + hex.EncodeToString(mac(l.secret, "name "+l.prefix, []byte(l.token+" "+l.name)))
}

// nameOf returns the name of token read from Redis, or why it does not
// count: too long, or, with a secret, without the signature the secret
// makes for the token and the name (the signature follows the last
// separator: a name may hold dots, a signature does not).
func nameOf(entry, token, prefix string, secret []byte) (string, error) {
	if len(entry) > maxMemberName+1+2*sha256.Size {
		return "", refuse(refusedLarge, "name of member %s of %d bytes, over %d", quoteRedis(token), len(entry), maxMemberName+1+2*sha256.Size)
	}
	i := strings.LastIndex(entry, memberSep)
	if len(secret) == 0 {
		// Not checked, as a member's signature is not: one that looks
		// like a signature is cut off.
		if i >= 0 && isSignature(entry[i+1:]) {
			entry = entry[:i]
		}
		return printable.Cut(entry, maxMemberName), nil
	}
	if i < 0 {
		return "", refuse(refusedUnsigned, "name of member %s has no signature, and redis_secret is set", quoteRedis(token))
	}
	name, sig := entry[:i], entry[i+1:]
	if !hmac.Equal([]byte(sig), []byte(hex.EncodeToString(mac(secret, "name "+prefix, []byte(token+" "+name))))) {
		return "", refuse(refusedSignature, "name of member %s is not signed with the secret", quoteRedis(token))
	}
	return printable.Cut(name, maxMemberName), nil
}

// isSignature reports whether s has the form of a signature: the hex of
// an HMAC-SHA256.
func isSignature(s string) bool {
	_, err := hex.DecodeString(s)
	return len(s) == 2*sha256.Size && err == nil
}

// Membership is what a heartbeat read of the fleet.
type Membership struct {
	// Members are the live members' tokens that passed vetting (this
	// instance's included), in token order.
	Members []string
	// Refused holds why each entry that did not pass was refused.
	Refused []error
	// Watermarks holds, for the live members that store one (those that
	// number their publishes) and whose entry passed vetting, the number
	// of their last publish Redis confirmed (see Coordinator).
	Watermarks map[string]uint64
	// WatermarksRefused holds why each watermark that did not pass was
	// refused: its member counts as one that stores none.
	WatermarksRefused []error
	// Now is Redis's clock.
	Now time.Time
}

// Heartbeat renews this instance's membership for ttl and stores its
// watermark (the number of its last publish Redis confirmed), drops the
// entries that would last more than ahead, and returns the live members,
// their watermarks and Redis's clock.
func (l *Leases) Heartbeat(ctx context.Context, ttl, ahead time.Duration) (Membership, error) {
	if err := checkTTL(ttl); err != nil {
		return Membership{}, err
	}
	ctx, done := l.call(ctx)
	defer done()
	res, err := heartbeatScript.Run(ctx, l.rdb, []string{membersKey(l.prefix), watermarksKey(l.prefix), namesKey(l.prefix)}, l.memberEntry(), ttl.Milliseconds(),
		max(ahead, ttl).Milliseconds(), maxMembers, l.watermarkEntry(l.sent.Load()), l.nameEntry()).Slice()
	if err != nil {
		return Membership{}, fmt.Errorf("lock: heartbeat: %w", err)
	}
	return l.membership("heartbeat", res)
}

// watchScript reads what heartbeatScript returns, writing nothing: Redis's
// clock, the live members (those whose entry lapses between now and
// ARGV[1] ms ahead, at most ARGV[2]) and their watermarks. A key of
// another type (anyone's write) reads as none.
var watchScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.pcall('ZRANGEBYSCORE', KEYS[1], now, now + tonumber(ARGV[1]), 'LIMIT', 0, tonumber(ARGV[2]))
if type(live) ~= 'table' or live.err then live = {} end
local marks = {}
if #live > 0 then
  marks = redis.pcall('HMGET', KEYS[2], unpack(live))
  if type(marks) ~= 'table' or marks.err then marks = {} end
end
return {tonumber(t[1]) * 1000000 + tonumber(t[2]), live, marks}
`)

// Watch reads the fleet's live members, their watermarks and Redis's
// clock as Heartbeat does, without joining: a passive instance (see
// Config.Passive) follows the fleet's statuses and is nobody's owner.
func (l *Leases) Watch(ctx context.Context, ahead time.Duration) (Membership, error) {
	ctx, done := l.call(ctx)
	defer done()
	res, err := watchScript.Run(ctx, l.rdb, []string{membersKey(l.prefix), watermarksKey(l.prefix)}, ahead.Milliseconds(), maxMembers).Slice()
	if err != nil {
		return Membership{}, fmt.Errorf("lock: read the members: %w", err)
	}
	return l.membership("read the members", res)
}

// membership vets what heartbeatScript or watchScript returned.
func (l *Leases) membership(what string, res []any) (Membership, error) {
	if len(res) != 3 {
		return Membership{}, fmt.Errorf("lock: %s: unexpected reply %v", what, res)
	}
	us, ok := res[0].(int64)
	if !ok {
		return Membership{}, fmt.Errorf("lock: %s: unexpected reply %v", what, res)
	}
	m := Membership{Now: time.UnixMicro(us), Watermarks: map[string]uint64{}}
	list, _ := res[1].([]any)
	marks, _ := res[2].([]any)
	for i, e := range list {
		s, _ := e.(string)
		tok, err := memberToken(s, l.prefix, l.secret)
		if err != nil {
			m.Refused = append(m.Refused, err)
			continue
		}
		m.Members = append(m.Members, tok)
		if i >= len(marks) {
			continue
		}
		if w, ok := marks[i].(string); ok {
			n, err := watermarkOf(w, tok, l.prefix, l.secret)
			if err != nil {
				m.WatermarksRefused = append(m.WatermarksRefused, err)
				continue
			}
			m.Watermarks[tok] = max(m.Watermarks[tok], n)
		}
	}
	slices.Sort(m.Members)
	m.Members = slices.Compact(m.Members)
	return m, nil
}

// Leave ends this instance's membership at once, and drops its watermark
// and name.
func (l *Leases) Leave(ctx context.Context) error {
	ctx, done := l.call(ctx)
	defer done()
	entry := l.memberEntry()
	_, err := l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZRem(ctx, membersKey(l.prefix), entry)
		p.HDel(ctx, watermarksKey(l.prefix), entry)
		p.HDel(ctx, namesKey(l.prefix), entry)
		return nil
	})
	// A key of another type (anyone's write) answers with an error: the
	// next heartbeat of another member replaces it.
	if err != nil && !replyError(err) {
		return fmt.Errorf("lock: leave: %w", err)
	}
	return nil
}

// takeScript takes a free lease, or extends one that is already ours. A
// lease held by the token ARGV[5] (when not empty: the member the caller
// takes the key over from, see TakeAll) is taken, and 3 returned. A lease
// that has no TTL, or whose TTL is above ARGV[3] ms (no instance sets
// one: a lease is renewed to its TTL), or, when ARGV[4] is "1", that holds
// no live instance's token (ARGV[6...]: the members the caller's heartbeat
// just read), is void: anyone's write, which would keep the key's rightful
// holder out for good. It is taken too, and 2 returned. A lease key of
// another type is void as well (SET replaces any type).
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
  if ARGV[5] ~= '' and v == ARGV[5] then
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    return 3
  end
  local left = redis.call('PTTL', KEYS[1])
  if left >= 0 and left <= tonumber(ARGV[3]) then
    if ARGV[4] ~= '1' then return 0 end
    for i = 6, #ARGV do
      if ARGV[i] == v then return 0 end
    end
  end
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 2
`)

// TakeAll takes, in one round trip, the leases on keys that are free,
// already ours, held by the member from gives for the key (the holder the
// caller takes it over from: a holder the fleet moved a key away from
// keeps its lease until its new owner takes it, see Coordinator.plan), or
// void (see takeScript: without a TTL or with one over twice ttl, or, for
// the keys of vetMembers, held by none of live), for ttl, and returns
// those it holds now and, of those, the ones that were void. On error,
// none is reported taken (some may be: they lapse unless renewed).
//
// A holder missing from live is void only for the keys of vetMembers:
// those the caller failed to take a round ago already. An instance that
// joined since the caller's heartbeat may have taken a key at once; by
// the next round the caller knows it.
func (l *Leases) TakeAll(ctx context.Context, keys []string, ttl time.Duration, live []string, vetMembers map[string]bool, from map[string]string) (taken, void []string, err error) {
	if len(keys) == 0 {
		return nil, nil, nil
	}
	if err := checkTTL(ttl); err != nil {
		return nil, nil, err
	}
	ctx, done := l.call(ctx)
	defer done()
	trust := []any{l.token, ttl.Milliseconds(), 2 * ttl.Milliseconds(), "0", ""}
	vet := make([]any, 0, 5+len(live))
	vet = append(vet, l.token, ttl.Milliseconds(), 2*ttl.Milliseconds(), "1", "")
	for _, m := range live {
		vet = append(vet, m)
	}
	calls := make([]scriptCall, len(keys))
	for i, k := range keys {
		calls[i] = scriptCall{keys: []string{leaseKey(l.prefix, k)}, args: trust}
		if vetMembers[k] {
			calls[i].args = vet
		}
		if f := from[k]; f != "" && f != l.token {
			args := slices.Clone(calls[i].args)
			args[4] = f
			calls[i].args = args
		}
	}
	cmds, err := evalEach(ctx, l.rdb, takeScript, calls)
	if err != nil {
		return nil, nil, fmt.Errorf("lock: take %d leases: %w", len(keys), err)
	}
	for i, c := range cmds {
		switch n, err := c.Int64(); {
		case err != nil:
		case n == 1, n == 3:
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

// ExtendAll extends, in one round trip, the leases on keys, which this
// instance holds, to ttl from now, and returns those Redis no longer has
// (lapsed, released or deleted): they are not ours any more.
//
// It sets the expiry whoever holds the lease, one command per key: Redis
// has no compare-and-expire, and a script would cost two more commands
// per key (its call and a GET), or one call per key in Redis Cluster,
// where the keys hash apart. That is safe, because a lease's value, not
// its expiry, is what fences a status write (the write script compares
// it): a lease another member took meanwhile, which this instance does
// not know yet, only lasts as it would have if that member had extended
// it, and this instance learns of it at its next write (refused, see
// Coordinator.write), at the latest when that member's first status,
// which is published, reaches it. A lease anyone stored (not a member's)
// is void, whatever its expiry, to the member the fleet gives the key to
// once its take failed a round (see TakeAll and SeizeAll).
func (l *Leases) ExtendAll(ctx context.Context, keys []string, ttl time.Duration) (lost []string, err error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if err := checkTTL(ttl); err != nil {
		return nil, err
	}
	ctx, done := l.call(ctx)
	defer done()
	cmds := make([]*redis.BoolCmd, len(keys))
	_, err = l.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.PExpire(ctx, leaseKey(l.prefix, k), ttl)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("lock: extend %d leases: %w", len(keys), err)
	}
	for i, c := range cmds {
		if !c.Val() {
			lost = append(lost, keys[i])
		}
	}
	return lost, nil
}

// ReleaseAll gives up, in one round trip, the leases on keys that are ours.
func (l *Leases) ReleaseAll(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	ctx, done := l.call(ctx)
	defer done()
	calls := make([]scriptCall, len(keys))
	for i, k := range keys {
		calls[i] = scriptCall{keys: []string{leaseKey(l.prefix, k)}, args: []any{l.token}}
	}
	if _, err := evalEach(ctx, l.rdb, releaseScript, calls); err != nil {
		return fmt.Errorf("lock: release %d leases: %w", len(keys), err)
	}
	return nil
}
