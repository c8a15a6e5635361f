package lock

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A RegistryCopy is a fleet's copy of its registry in Redis, written by
// the one instance holding the registry lease (the follower, which reads
// the registry itself) and read by every other. The copy is opaque here:
// named fields of bytes (pgcluster puts a cluster's rows in each).
//
// Redis holds, under the prefix, in one hash tag so that one script
// touches them all on Redis Cluster too:
//
//	<prefix>{registry}:lease  the follower's token, with a TTL
//	<prefix>{registry}:copy   a hash: "v" the version, "head" the signed
//	                          head, "f:<name>" each field
//	<prefix>{registry}:log    a sorted set by version: what each of the
//	                          last copyLogKeep versions changed
//	<prefix>registry          the channel each new version is published on
//
// Every write is one fenced script: nothing is written unless the lease
// holds the writer's token. A version names one write; a term names one
// follower's run of writes, each term starting with a full write. The head
// carries the term, the version, and a digest of every field: the XOR of
// an HMAC of each field's name and value, keyed with the secret when there
// is one, so that a reader that applied only the fields a version changed
// can tell that it holds what the follower wrote, and a field written by
// anyone without the secret, or replayed from another version, is found.
type RegistryCopy struct {
	rdb    redis.UniversalClient
	prefix string
	secret []byte
	leases *Leases
}

// copyLogKeep is how many versions the log remembers: a reader further
// behind reads the copy whole.
const copyLogKeep = 256

// registryLease is the key of the registry lease (a check's key always
// holds a "/", so it cannot be this).
const registryLease = "registry"

func copyKey(prefix string) string     { return prefix + "{" + registryLease + "}:copy" }
func copyLogKey(prefix string) string  { return prefix + "{" + registryLease + "}:log" }
func copyChannel(prefix string) string { return prefix + "registry" }

// NewRegistryCopy returns the copy under prefix on rdb, for a new instance
// with a fresh token. With secret, heads are signed and fields keyed with
// it, and a copy without them is refused.
func NewRegistryCopy(rdb redis.UniversalClient, prefix string, secret []byte) (*RegistryCopy, error) {
	l, err := NewLeases(rdb, prefix)
	if err != nil {
		return nil, err
	}
	return &RegistryCopy{rdb: rdb, prefix: prefix, secret: secret, leases: l}, nil
}

// Token is this instance's token: the registry lease's value while it
// follows.
func (c *RegistryCopy) Token() string { return c.leases.Token() }

// CopyHead is the signed head of a copy: what a reader checks the fields
// against.
type CopyHead struct {
	// Term is Redis's clock, in µs, when the follower that wrote this
	// version took the lease (or came back to Redis with it): a copy of a
	// later term replaces one of an earlier term, whatever the versions.
	Term int64 `json:"term"`
	// Version is this write's; Prev the one it was written over (0 for
	// the first write of an empty copy).
	Version int64 `json:"v"`
	Prev    int64 `json:"prev"`
	// Digest is the XOR of every field's element (hex), Fields how many.
	Digest string `json:"digest"`
	Fields int    `json:"n"`
	// Seen is when the follower learned of the change this version
	// brings, on its clock, in µs (0: unknown).
	Seen int64 `json:"seen,omitempty"`
	// Alive is a moment, by Redis's clock in µs, at which the follower was
	// connected to the registry with every change it had read written
	// here: the copy was as fresh as the registry then.
	Alive int64 `json:"alive,omitempty"`
}

// headKey is what the head's HMAC covers besides its JSON (a status's key
// always holds a "/", so none is this).
const headKey = "registry copy head"

var (
	errCopyUnsigned = errors.New("unsigned copy head")
	errCopyBadSig   = errors.New("wrongly signed copy head")
)

func (c *RegistryCopy) encodeHead(h CopyHead) string {
	j, _ := json.Marshal(h) // numbers and a string: cannot fail
	if len(c.secret) == 0 {
		return string(j)
	}
	return sigPrefix + hex.EncodeToString(mac(c.secret, headKey, j)) + " " + string(j)
}

// DecodeHead reads a head, checking its signature when there is a secret.
func (c *RegistryCopy) DecodeHead(raw string) (CopyHead, error) {
	var h CopyHead
	body := raw
	if rest, ok := strings.CutPrefix(raw, sigPrefix); ok {
		sig, j, ok := strings.Cut(rest, " ")
		if !ok {
			return h, errCopyBadSig
		}
		// Exactly as encodeHead writes it (lowercase hex): one signed head
		// has one spelling, as for a status (decode).
		if len(c.secret) > 0 && !hmac.Equal([]byte(sig), hex.AppendEncode(nil, mac(c.secret, headKey, []byte(j)))) {
			return h, errCopyBadSig
		}
		body = j
	} else if len(c.secret) > 0 {
		return h, errCopyUnsigned
	}
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		return h, fmt.Errorf("copy head: %w", err)
	}
	if h.Version <= 0 || h.Term <= 0 || len(h.Digest) != 2*sha256.Size {
		return h, errors.New("copy head without term, version or digest")
	}
	return h, nil
}

// element is a field's share of the digest.
func (c *RegistryCopy) element(name string, value []byte) [sha256.Size]byte {
	key := c.secret
	if len(key) == 0 {
		key = []byte("pgcluster registry copy")
	}
	return [sha256.Size]byte(mac(key, "f:"+name, value))
}

// CopyState is a copy as one instance holds it: the follower what it
// wrote, a reader what it applied. The zero value holds nothing.
type CopyState struct {
	Term    int64
	Version int64
	elems   map[string][sha256.Size]byte
	digest  [sha256.Size]byte
	// prev and seen are the head's, as written (see CopyHead).
	prev, seen int64
}

// Empty reports whether the state holds no copy yet.
func (s *CopyState) Empty() bool { return s.Version == 0 }

// with returns s with fields set (a nil value deletes the field); full
// starts from nothing.
func (c *RegistryCopy) with(s *CopyState, fields map[string][]byte, full bool) *CopyState {
	n := &CopyState{Term: s.Term, Version: s.Version}
	if full {
		n.elems = make(map[string][sha256.Size]byte, len(fields))
	} else {
		n.elems, n.digest = maps.Clone(s.elems), s.digest
		if n.elems == nil {
			n.elems = map[string][sha256.Size]byte{}
		}
	}
	for name, v := range fields {
		if old, ok := n.elems[name]; ok {
			xor(&n.digest, old)
			delete(n.elems, name)
		}
		if v != nil {
			e := c.element(name, v)
			xor(&n.digest, e)
			n.elems[name] = e
		}
	}
	return n
}

func xor(d *[sha256.Size]byte, e [sha256.Size]byte) {
	for i := range d {
		d[i] ^= e[i]
	}
}

// head is the head of the copy s is, vouched fresh at alive (zero: not).
func (s *CopyState) head(alive time.Time) CopyHead {
	h := CopyHead{Term: s.Term, Version: s.Version, Prev: s.prev, Seen: s.seen,
		Digest: hex.EncodeToString(s.digest[:]), Fields: len(s.elems)}
	if !alive.IsZero() {
		h.Alive = alive.UnixMicro()
	}
	return h
}

// matches reports whether s holds what h says the copy holds.
func (s *CopyState) matches(h CopyHead) bool {
	return h.Fields == len(s.elems) && h.Digest == hex.EncodeToString(s.digest[:])
}

// Write results.
const (
	// CopyWritten: the version is stored and published.
	CopyWritten = iota
	// CopyFenced: the lease is not the writer's; nothing was written.
	CopyFenced
	// CopyDiverged: the stored version is not the one the write was made
	// over (a delta), or not below the new one (a full write): write the
	// copy whole, above Stored.
	CopyDiverged
)

// CopyWrite is one version to write.
type CopyWrite struct {
	// Fields holds the fields written; a nil value deletes one. With Full,
	// it holds every field and the copy is replaced.
	Fields map[string][]byte
	Full   bool
	// Version is the new version: above the one written over.
	Version int64
	// Term is the follower's term (see CopyHead).
	Term int64
	// Seen: see CopyHead.
	Seen time.Time
	// Alive: see CopyHead; zero when the follower cannot vouch for it.
	Alive time.Time
}

// CopyResult is what Write did.
type CopyResult struct {
	Result int
	// State is the copy as written (CopyWritten).
	State *CopyState
	// Stored is the version found stored (CopyDiverged).
	Stored int64
}

// writeCopyScript writes one version, fenced by the lease.
//
// KEYS[1] lease, KEYS[2] copy, KEYS[3] log. ARGV[1] token, ARGV[2] lease
// TTL in ms, ARGV[3] "full" or "delta", ARGV[4] the version written over
// (delta), ARGV[5] the new version, ARGV[6] the head, ARGV[7] the log
// entry, ARGV[8] the channel, ARGV[9] the number of fields set, then
// name/value pairs of the fields set, then the names of the fields
// deleted. Returns {1, version}, {-1, 0} when the lease is not the
// caller's, {-2, stored} when the stored version does not fit.
var writeCopyScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {-1, 0}
end
local stored = tonumber(redis.call('HGET', KEYS[2], 'v') or '0') or 0
local v = tonumber(ARGV[5])
if ARGV[3] == 'delta' then
  if stored ~= tonumber(ARGV[4]) then return {-2, stored} end
elseif v <= stored then
  return {-2, stored}
end
if ARGV[3] == 'full' then
  redis.call('DEL', KEYS[2], KEYS[3])
end
local n = tonumber(ARGV[9])
local i = 10
for _ = 1, n do
  redis.call('HSET', KEYS[2], 'f:' .. ARGV[i], ARGV[i + 1])
  i = i + 2
end
while i <= #ARGV do
  redis.call('HDEL', KEYS[2], 'f:' .. ARGV[i])
  i = i + 1
end
redis.call('HSET', KEYS[2], 'v', ARGV[5], 'head', ARGV[6])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[7])
local old = redis.call('ZRANGE', KEYS[3], -` + strconv.Itoa(copyLogKeep+1) + `, -` + strconv.Itoa(copyLogKeep+1) + `, 'WITHSCORES')
if old[2] then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', old[2])
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PUBLISH', ARGV[8], ARGV[5])
return {1, v}
`)

// Write writes w over prev (the copy as this follower last wrote it; for a
// full write, anything), fenced by the lease, renewing it for ttl, and
// publishes the version, in one step.
func (c *RegistryCopy) Write(ctx context.Context, prev *CopyState, w CopyWrite, ttl time.Duration) (CopyResult, error) {
	if err := checkTTL(ttl); err != nil {
		return CopyResult{}, err
	}
	st := c.with(prev, w.Fields, w.Full)
	st.Term, st.Version, st.prev = w.Term, w.Version, prev.Version
	if !w.Seen.IsZero() {
		st.seen = w.Seen.UnixMicro()
	}
	h := st.head(w.Alive)
	mode, entry := "delta", strconv.FormatInt(w.Version, 10)+" "+strconv.FormatInt(prev.Version, 10)+" "
	if w.Full {
		mode, entry = "full", entry+"*"
	} else {
		entry += "="
	}
	var set, del []any
	for name, v := range w.Fields {
		switch {
		case v != nil:
			set = append(set, name, v)
		case !w.Full:
			del = append(del, name)
		}
		if !w.Full {
			entry += "\x00" + name
		}
	}
	args := append([]any{c.Token(), ttl.Milliseconds(), mode, prev.Version, w.Version, c.encodeHead(h), entry,
		copyChannel(c.prefix), len(set) / 2}, append(set, del...)...)
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	res, err := writeCopyScript.Run(ctx, c.rdb, []string{leaseKey(c.prefix, registryLease), copyKey(c.prefix), copyLogKey(c.prefix)}, args...).Int64Slice()
	if err != nil {
		return CopyResult{}, fmt.Errorf("lock: write the registry copy: %w", err)
	}
	if len(res) != 2 {
		return CopyResult{}, fmt.Errorf("lock: write the registry copy: unexpected reply %v", res)
	}
	switch res[0] {
	case 1:
		return CopyResult{Result: CopyWritten, State: st}, nil
	case -1:
		return CopyResult{Result: CopyFenced}, nil
	default:
		return CopyResult{Result: CopyDiverged, Stored: res[1]}, nil
	}
}

// pollScript takes the registry lease when asked and it is free, and
// returns {taken, holder, version, head, Redis's clock in µs, the lease's
// time to live in ms (negative without a lease)}.
var pollScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local held = redis.call('GET', KEYS[1])
local taken = 0
if ARGV[3] == '1' and not held then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  taken = 1
  held = ARGV[1]
end
local t = redis.call('TIME')
return {taken, held or '', redis.call('HGET', KEYS[2], 'v') or '', redis.call('HGET', KEYS[2], 'head') or '',
  tonumber(t[1]) * 1000000 + tonumber(t[2]), redis.call('PTTL', KEYS[1])}
`)

// CopyPoll is what Poll read.
type CopyPoll struct {
	// Taken: this instance took the lease, for the TTL asked.
	Taken bool
	// Holder is the lease holder's token, "" when nobody holds it.
	Holder string
	// Version is the stored version, 0 when there is no copy.
	Version int64
	// Head is the stored head as written, "" when there is none: check it
	// with DecodeHead.
	Head string
	// Now is Redis's clock.
	Now time.Time
	// Left is how long the lease has to live, 0 without one: a holder
	// that died loses it then, and another instance may take it.
	Left time.Duration
}

// Poll reads, in one round trip, who holds the registry lease, the copy's
// version and head, and Redis's clock; with take, it takes the lease for
// ttl when nobody holds it.
func (c *RegistryCopy) Poll(ctx context.Context, take bool, ttl time.Duration) (CopyPoll, error) {
	if err := checkTTL(ttl); err != nil {
		return CopyPoll{}, err
	}
	t := "0"
	if take {
		t = "1"
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	res, err := pollScript.Run(ctx, c.rdb, []string{leaseKey(c.prefix, registryLease), copyKey(c.prefix)}, c.Token(), ttl.Milliseconds(), t).Slice()
	if err != nil {
		return CopyPoll{}, fmt.Errorf("lock: poll the registry copy: %w", err)
	}
	if len(res) != 6 {
		return CopyPoll{}, fmt.Errorf("lock: poll the registry copy: unexpected reply %v", res)
	}
	taken, _ := res[0].(int64)
	holder, _ := res[1].(string)
	vs, _ := res[2].(string)
	head, _ := res[3].(string)
	now, _ := res[4].(int64)
	left, _ := res[5].(int64)
	v, _ := strconv.ParseInt(vs, 10, 64)
	return CopyPoll{Taken: taken == 1, Holder: holder, Version: v, Head: head, Now: time.UnixMicro(now),
		Left: time.Duration(max(left, 0)) * time.Millisecond}, nil
}

// renewCopyScript extends the registry lease while it holds the caller's
// token and, when given one, stores a new head for the stored version.
// Returns Redis's clock in µs, or -1 when the lease is not the caller's.
var renewCopyScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if ARGV[4] ~= '' and redis.call('HGET', KEYS[2], 'v') == ARGV[3] then
  redis.call('HSET', KEYS[2], 'head', ARGV[4])
end
local t = redis.call('TIME')
return tonumber(t[1]) * 1000000 + tonumber(t[2])
`)

// Renew extends the registry lease for ttl while it is this instance's,
// and, when alive is not zero, vouches in the head of st (the copy as this
// follower wrote it) that the copy was as fresh as the registry at alive.
// It returns Redis's clock, and false when the lease is another's or gone.
func (c *RegistryCopy) Renew(ctx context.Context, st *CopyState, alive time.Time, ttl time.Duration) (time.Time, bool, error) {
	if err := checkTTL(ttl); err != nil {
		return time.Time{}, false, err
	}
	head := ""
	if !alive.IsZero() && !st.Empty() {
		head = c.encodeHead(st.head(alive))
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	now, err := renewCopyScript.Run(ctx, c.rdb, []string{leaseKey(c.prefix, registryLease), copyKey(c.prefix)},
		c.Token(), ttl.Milliseconds(), st.Version, head).Int64()
	if err != nil {
		return time.Time{}, false, fmt.Errorf("lock: renew the registry lease: %w", err)
	}
	if now < 0 {
		return time.Time{}, false, nil
	}
	return time.UnixMicro(now), true, nil
}

// Release gives the registry lease up, while it is this instance's, so
// that another instance takes it at once.
func (c *RegistryCopy) Release(ctx context.Context) error {
	_, err := c.leases.Release(ctx, registryLease)
	return err
}
