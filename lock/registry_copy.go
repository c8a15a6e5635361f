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
//
// Nothing read back is trusted before it is vetted (registry_copy_vet.go):
// sizes are bounded, and versions and times are bounded by Redis's own
// clock, read in the same script, so that nothing written without the
// secret (or by accident) looks newer than every genuine copy for good.
type RegistryCopy struct {
	rdb    redis.UniversalClient
	prefix string
	secret []byte
	leases *Leases
	// lease is the registry lease's TTL: how far ahead of Redis's clock
	// a term or a time vouched for may be.
	lease time.Duration
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

// NewRegistryCopy returns the copy under prefix on rdb, for the instance
// named by token ("" draws a fresh one: see NewToken), whose followers hold
// the registry lease for lease.
// With secret, heads are signed and fields keyed with it, and a copy
// without them is refused.
func NewRegistryCopy(rdb redis.UniversalClient, prefix string, secret []byte, lease time.Duration, token string) (*RegistryCopy, error) {
	if err := checkTTL(lease); err != nil {
		return nil, err
	}
	l, err := leasesOf(rdb, prefix, token)
	if err != nil {
		return nil, err
	}
	return &RegistryCopy{rdb: rdb, prefix: prefix, secret: secret, leases: l, lease: lease}, nil
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
	// Registry names the registry the copy was read from (the caller's
	// words: pgcluster names its system identifier, database and zones),
	// so that a fleet refuses a copy of another registry.
	Registry string `json:"reg,omitempty"`
}

// headKey is what the head's HMAC covers besides its JSON (a status's key
// always holds a "/", so none is this).
const headKey = "registry copy head"

// Errors of a head that the secret did not sign.
var (
	ErrCopyUnsigned      = errors.New("unsigned copy head")
	ErrCopyWronglySigned = errors.New("wrongly signed copy head")
)

func (c *RegistryCopy) encodeHead(h CopyHead) string {
	j, _ := json.Marshal(h) // numbers and a string: cannot fail
	if len(c.secret) == 0 {
		return string(j)
	}
	return sigPrefix + hex.EncodeToString(mac(c.secret, headKey, j)) + " " + string(j)
}

// DecodeHead reads a head, checking its signature when there is a secret,
// and its size and form; VetHead checks it against Redis's clock too.
func (c *RegistryCopy) DecodeHead(raw string) (CopyHead, error) {
	var h CopyHead
	if len(raw) > copyMaxHead {
		return h, copyOutOfBounds("a head of %d bytes", len(raw))
	}
	body := raw
	if rest, ok := strings.CutPrefix(raw, sigPrefix); ok {
		sig, j, ok := strings.Cut(rest, " ")
		if !ok {
			return h, ErrCopyWronglySigned
		}
		// Exactly as encodeHead writes it (lowercase hex): one signed head
		// has one spelling, as for a status (decode).
		if len(c.secret) > 0 && !hmac.Equal([]byte(sig), hex.AppendEncode(nil, mac(c.secret, headKey, []byte(j)))) {
			return h, ErrCopyWronglySigned
		}
		body = j
	} else if len(c.secret) > 0 {
		return h, ErrCopyUnsigned
	}
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		return h, fmt.Errorf("copy head: %w", err)
	}
	if h.Version <= 0 || h.Term <= 0 || !isDigest(h.Digest) {
		return h, errors.New("copy head without term, version or digest")
	}
	return h, nil
}

// isDigest reports whether d is a digest as head writes it: lowercase hex
// of sha256.Size bytes.
func isDigest(d string) bool {
	if len(d) != 2*sha256.Size {
		return false
	}
	for i := range len(d) {
		if (d[i] < '0' || d[i] > '9') && (d[i] < 'a' || d[i] > 'f') {
			return false
		}
	}
	return true
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
	// prev, seen, alive and registry are the head's, as written (see
	// CopyHead): alive the last moment vouched for.
	prev, seen, alive int64
	registry          string
	// written is, for the follower, the head it stored last: a renewal
	// that finds another one knows that someone else wrote the copy.
	written string
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

// head is the head of the copy s is.
func (s *CopyState) head() CopyHead {
	return CopyHead{Term: s.Term, Version: s.Version, Prev: s.prev, Seen: s.seen, Alive: s.alive,
		Registry: s.registry, Digest: hex.EncodeToString(s.digest[:]), Fields: len(s.elems)}
}

// Alive is the last moment, by Redis's clock, the follower vouched that the
// copy was as fresh as the registry; zero when it never did.
func (s *CopyState) Alive() time.Time {
	if s.alive <= 0 {
		return time.Time{}
	}
	return time.UnixMicro(s.alive)
}

// Registry is the registry the copy names (see CopyHead).
func (s *CopyState) Registry() string { return s.registry }

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
	// CopyAhead: the new version is ahead of Redis's clock (see
	// CopyVersionAhead), Stored the most it may be: no reader would take
	// it; nothing was written.
	CopyAhead
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
	// Alive: see CopyHead; zero when the follower cannot vouch for it
	// anew (the last moment vouched for is kept).
	Alive time.Time
	// Registry: see CopyHead.
	Registry string
}

// CopyResult is what Write did.
type CopyResult struct {
	Result int
	// State is the copy as written (CopyWritten).
	State *CopyState
	// Stored is the version found stored (CopyDiverged), 0 when what is
	// stored is no version (not a number, or ahead of Redis's clock): a
	// full write replaces it whatever its number.
	Stored int64
}

// copyVersionLua is Lua that sets maxv, the largest version Redis's clock
// allows (MaxCopyVersion), and stored, the copy's version vetted as
// parseCopyVersion vets it: 0 when there is none, or it is not a positive
// number of at most copyMaxVersionText digits, or it is above maxv. KEYS[2]
// is the copy.
var copyVersionLua = `
local clock = redis.call('TIME')
local maxv = tonumber(clock[1]) + ` + strconv.Itoa(CopyVersionAhead) + `
local raw = false
if redis.call('HSTRLEN', KEYS[2], 'v') <= ` + strconv.Itoa(copyMaxVersionText) + ` then
  raw = redis.call('HGET', KEYS[2], 'v')
end
local stored = 0
if raw and #raw <= ` + strconv.Itoa(copyMaxVersionText) + ` and string.match(raw, '^[1-9]%d*$') and tonumber(raw) <= maxv then
  stored = tonumber(raw)
end
`

// writeCopyScript writes one version, fenced by the lease. A stored
// version that is none (see copyVersionLua) counts as 0: a full write
// replaces it.
//
// KEYS[1] lease, KEYS[2] copy, KEYS[3] log. ARGV[1] token, ARGV[2] lease
// TTL in ms, ARGV[3] "full" or "delta", ARGV[4] the version written over
// (delta), ARGV[5] the new version, ARGV[6] the head, ARGV[7] the log
// entry, ARGV[8] the channel, ARGV[9] the number of fields set, then
// name/value pairs of the fields set, then the names of the fields
// deleted. Returns {1, version}, {-1, 0} when the lease is not the
// caller's, {-2, stored} when the stored version does not fit, {-3, maxv}
// when the new version is ahead of Redis's clock.
var writeCopyScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {-1, 0}
end
` + copyVersionLua + `
local v = tonumber(ARGV[5])
if v > maxv then return {-3, maxv} end
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
	st.Term, st.Version, st.prev, st.registry, st.alive = w.Term, w.Version, prev.Version, w.Registry, prev.alive
	if !w.Seen.IsZero() {
		st.seen = w.Seen.UnixMicro()
	}
	if !w.Alive.IsZero() {
		st.alive = max(st.alive, w.Alive.UnixMicro())
	}
	st.written = c.encodeHead(st.head())
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
	args := append([]any{c.Token(), ttl.Milliseconds(), mode, prev.Version, w.Version, st.written, entry,
		copyChannel(c.prefix), len(set) / 2}, append(set, del...)...)
	ctx, cancel := c.leases.call(ctx)
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
	case -3:
		return CopyResult{Result: CopyAhead, Stored: res[1]}, nil
	default:
		return CopyResult{Result: CopyDiverged, Stored: res[1]}, nil
	}
}

// pollScript takes the registry lease when asked and it is free, and
// returns {taken, holder, version, head, Redis's clock in µs, the lease's
// time to live in ms (negative without a lease), the head's size}.
//
// A lease that no follower could have written is free: one without a TTL
// (a follower's always has one, so one without would be held for good by
// whoever wrote it), with a TTL beyond the lease's, or whose value is no
// token. A version or head larger than any a follower writes is not
// returned (the head's size is): nobody makes every poll carry megabytes.
//
// KEYS[1] lease, KEYS[2] copy. ARGV[1] token, ARGV[2] lease TTL in ms,
// ARGV[3] "1" to take the lease when it is free.
var pollScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local held = redis.call('GET', KEYS[1])
local ttl = redis.call('PTTL', KEYS[1])
if held and (ttl < 0 or ttl > tonumber(ARGV[2]) or #held ~= ` + strconv.Itoa(2*tokenBytes) + `) then
  held = false
end
local taken = 0
if ARGV[3] == '1' and not held then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  taken = 1
  held = ARGV[1]
  ttl = tonumber(ARGV[2])
end
if not held then ttl = -2 end
local v = ''
if redis.call('HSTRLEN', KEYS[2], 'v') <= ` + strconv.Itoa(copyMaxVersionText+1) + ` then
  v = redis.call('HGET', KEYS[2], 'v') or ''
end
local size = redis.call('HSTRLEN', KEYS[2], 'head')
local head = ''
if size <= ` + strconv.Itoa(copyMaxHead) + ` then head = redis.call('HGET', KEYS[2], 'head') or '' end
local t = redis.call('TIME')
return {taken, held or '', v, head, tonumber(t[1]) * 1000000 + tonumber(t[2]), ttl, size}
`)

// CopyPoll is what Poll read.
type CopyPoll struct {
	// Taken: this instance took the lease, for the TTL asked.
	Taken bool
	// Holder is the lease holder's token, "" when nobody holds it (or
	// only a lease no follower could have taken: see pollScript).
	Holder string
	// Version is the stored version: 0 when there is no copy, -1 when
	// what is stored is no version (see ParseCopyVersion), which a
	// reader refuses and the follower writes over.
	Version int64
	// Head is the stored head as written, "" when there is none or it is
	// larger than any head a follower writes: check it with PollHead.
	Head string
	// Now is Redis's clock.
	Now time.Time
	// Left is how long the lease has to live, 0 without one: a holder
	// that died loses it then, and another instance may take it.
	Left time.Duration
	// headSize is the stored head's size.
	headSize int64
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
	ctx, cancel := c.leases.call(ctx)
	defer cancel()
	res, err := pollScript.Run(ctx, c.rdb, []string{leaseKey(c.prefix, registryLease), copyKey(c.prefix)}, c.Token(), ttl.Milliseconds(), t).Slice()
	if err != nil {
		return CopyPoll{}, fmt.Errorf("lock: poll the registry copy: %w", err)
	}
	if len(res) != 7 {
		return CopyPoll{}, fmt.Errorf("lock: poll the registry copy: unexpected reply %v", res)
	}
	taken, _ := res[0].(int64)
	holder, _ := res[1].(string)
	vs, _ := res[2].(string)
	head, _ := res[3].(string)
	now, _ := res[4].(int64)
	left, _ := res[5].(int64)
	size, _ := res[6].(int64)
	p := CopyPoll{Taken: taken == 1, Holder: holder, Head: head, Now: time.UnixMicro(now),
		Left: time.Duration(max(left, 0)) * time.Millisecond, headSize: size}
	if vs != "" || size > 0 {
		p.Version = -1
		if v, err := parseCopyVersion(vs, p.Now); err == nil {
			p.Version = v
		}
	}
	return p, nil
}

// PollHead is the head p read, vetted (VetHead) with the clock p read: an
// error when the copy is no copy a follower wrote (a version stored that
// is not the head's is one). Without a copy, it is ErrNoCopy.
func (c *RegistryCopy) PollHead(p CopyPoll) (CopyHead, error) {
	switch {
	case p.Version == 0:
		return CopyHead{}, ErrNoCopy
	case p.headSize > copyMaxHead:
		return CopyHead{}, &CopyRejected{p.Version, copyOutOfBounds("a head of %d bytes", p.headSize)}
	case p.Version < 0:
		return CopyHead{}, &CopyRejected{p.Version, copyOutOfBounds("the version stored is no version")}
	}
	h, err := c.VetHead(p.Head, p.Now)
	if err != nil {
		return h, &CopyRejected{p.Version, err}
	}
	if h.Version != p.Version {
		return h, &CopyRejected{p.Version, fmt.Errorf("the head is of version %d", h.Version)}
	}
	return h, nil
}

// renewCopyScript extends the registry lease while it holds the caller's
// token and, when given one, stores a new head for the stored version.
// Returns {Redis's clock in µs, 1 when the copy holds the version and the
// head the caller wrote last, 1 when the new head is stored}, or {-1, 0, 0}
// when the lease is not the caller's.
//
// KEYS[1] lease, KEYS[2] copy. ARGV[1] token, ARGV[2] lease TTL in ms,
// ARGV[3] the version written last, ARGV[4] the new head ("": none),
// ARGV[5] the head written last ("": none yet).
var renewCopyScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {-1, 0, 0}
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local intact, stored = 1, 0
if ARGV[4] ~= '' then
  local v = false
  if redis.call('HSTRLEN', KEYS[2], 'v') == #ARGV[3] then v = redis.call('HGET', KEYS[2], 'v') end
  local head = false
  if redis.call('HSTRLEN', KEYS[2], 'head') == #ARGV[5] then head = redis.call('HGET', KEYS[2], 'head') end
  if v ~= ARGV[3] then
    intact = 0
  else
    if head ~= ARGV[5] then intact = 0 end
    if head ~= ARGV[4] then redis.call('HSET', KEYS[2], 'head', ARGV[4]) end
    stored = 1
  end
end
local t = redis.call('TIME')
return {tonumber(t[1]) * 1000000 + tonumber(t[2]), intact, stored}
`)

// CopyRenewal is what Renew found.
type CopyRenewal struct {
	// Now is Redis's clock.
	Now time.Time
	// Held: the lease is still this instance's, renewed.
	Held bool
	// Intact: the copy holds the version and the head this follower
	// stored last. When not, someone else wrote it: the follower should
	// check the copy, or write it whole when the version is another.
	Intact bool
	// HeadStored: the copy holds the version this follower wrote last, and
	// its head is stored again (over any other).
	HeadStored bool
}

// Renew extends the registry lease for ttl while it is this instance's,
// and stores the head of st (the copy as this follower wrote it) again
// over any other: when alive is not zero, vouching in it that the copy
// was as fresh as the registry at alive. st records the head stored.
func (c *RegistryCopy) Renew(ctx context.Context, st *CopyState, alive time.Time, ttl time.Duration) (CopyRenewal, error) {
	if err := checkTTL(ttl); err != nil {
		return CopyRenewal{}, err
	}
	head, a := "", st.alive
	if !st.Empty() {
		if !alive.IsZero() {
			a = max(a, alive.UnixMicro())
		}
		h := st.head()
		h.Alive = a
		head = c.encodeHead(h)
	}
	ctx, cancel := c.leases.call(ctx)
	defer cancel()
	res, err := renewCopyScript.Run(ctx, c.rdb, []string{leaseKey(c.prefix, registryLease), copyKey(c.prefix)},
		c.Token(), ttl.Milliseconds(), st.Version, head, st.written).Int64Slice()
	if err != nil {
		return CopyRenewal{}, fmt.Errorf("lock: renew the registry lease: %w", err)
	}
	if len(res) != 3 {
		return CopyRenewal{}, fmt.Errorf("lock: renew the registry lease: unexpected reply %v", res)
	}
	if res[0] < 0 {
		return CopyRenewal{}, nil
	}
	if res[2] == 1 {
		st.alive, st.written = a, head
	}
	return CopyRenewal{Now: time.UnixMicro(res[0]), Held: true, Intact: res[1] == 1, HeadStored: res[2] == 1}, nil
}

// Release gives the registry lease up, while it is this instance's, so
// that another instance takes it at once.
func (c *RegistryCopy) Release(ctx context.Context) error {
	_, err := c.leases.Release(ctx, registryLease)
	return err
}
