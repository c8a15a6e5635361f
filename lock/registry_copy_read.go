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

// Errors of Read besides Redis's own.
var (
	// ErrNoCopy: Redis holds no registry copy (none written yet, or lost).
	ErrNoCopy = errors.New("no registry copy in Redis")
	// ErrCopyStale: the copy is older than the state read from (a copy
	// replayed whole, or a follower's write still to come).
	ErrCopyStale = errors.New("the registry copy in Redis is older than the one applied")
	// ErrCopyDiffers: Check found a copy other than the one written.
	ErrCopyDiffers = errors.New("the registry copy in Redis is not the one written")
)

// CopyRejected is the error of a copy that is not what a follower wrote:
// unsigned or wrongly signed (with a secret), or fields that do not make
// the digest its head signs.
type CopyRejected struct {
	Version int64 // the stored version
	Err     error
}

func (e *CopyRejected) Error() string {
	return fmt.Sprintf("registry copy version %d rejected: %v", e.Version, e.Err)
}

func (e *CopyRejected) Unwrap() error { return e.Err }

// CopyRead is what Read brought.
type CopyRead struct {
	// Head is the stored head, checked.
	Head CopyHead
	// Fields holds the fields changed since the state read from (a nil
	// value: deleted), none when the copy has not changed; with Full,
	// every field: the copy replaces the state.
	Fields map[string][]byte
	Full   bool
	// State is the copy now held, to read from next time.
	State *CopyState
	// Now is Redis's clock at the read.
	Now time.Time
}

// readSinceScript reads what changed since version ARGV[1], with Redis's
// clock in µs (now): {"none", now} without a copy; {"same", now, v,
// head}; {"gap", now, v} when the log does not lead from ARGV[1] to v by
// deltas alone (or leads through more entries, or longer ones, than a
// follower writes); {"delta", now, v, head, name, value, ...} with every
// field the versions since changed (false: deleted); {"bad", now, v,
// what} when the version, the head or a field is larger than any a
// follower writes (see registry_copy_vet.go), which is never returned.
//
// KEYS[1] copy, KEYS[2] log.
var readSinceScript = redis.NewScript(`
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local vlen = redis.call('HSTRLEN', KEYS[1], 'v')
if vlen == 0 and not redis.call('HGET', KEYS[1], 'v') then return {'none', now} end
if vlen > ` + strconv.Itoa(copyMaxVersionText) + ` then return {'bad', now, '', 'a version of ' .. vlen .. ' bytes'} end
local v = redis.call('HGET', KEYS[1], 'v')
local hlen = redis.call('HSTRLEN', KEYS[1], 'head')
if hlen > ` + strconv.Itoa(copyMaxHead) + ` then return {'bad', now, v, 'a head of ' .. hlen .. ' bytes'} end
if v == ARGV[1] then return {'same', now, v, redis.call('HGET', KEYS[1], 'head') or ''} end
local es = redis.call('ZRANGE', KEYS[2], '(' .. ARGV[1], '+inf', 'BYSCORE', 'LIMIT', 0, ` + strconv.Itoa(copyLogKeep+1) + `)
if #es > ` + strconv.Itoa(copyLogKeep) + ` then return {'gap', now, v} end
local expect = ARGV[1]
local names, seen = {}, {}
for _, e in ipairs(es) do
  if #e > ` + strconv.Itoa(copyMaxEntry) + ` then return {'gap', now, v} end
  local ev, prev, kind, rest = string.match(e, '^(%d+) (%d+) ([*=])(.*)$')
  if not ev or prev ~= expect or kind ~= '=' then return {'gap', now, v} end
  for name in string.gmatch(rest, '[^%z]+') do
    if #name > ` + strconv.Itoa(copyMaxName) + ` then return {'gap', now, v} end
    if not seen[name] then
      seen[name] = true
      names[#names + 1] = name
    end
  end
  if #names > ` + strconv.Itoa(copyMaxFields) + ` then return {'gap', now, v} end
  expect = ev
end
if expect ~= v then return {'gap', now, v} end
local out = {'delta', now, v, redis.call('HGET', KEYS[1], 'head') or ''}
local total = 0
for _, name in ipairs(names) do
  local n = redis.call('HSTRLEN', KEYS[1], 'f:' .. name)
  total = total + n
  if n > ` + strconv.Itoa(copyMaxField) + ` or total > ` + strconv.Itoa(copyMaxBytes) + ` then
    return {'bad', now, v, 'a field of ' .. n .. ' bytes'}
  end
  out[#out + 1] = name
  out[#out + 1] = redis.call('HGET', KEYS[1], 'f:' .. name) or false
end
return out
`)

// readAllScript reads the whole copy, with Redis's clock in µs (now):
// {"none", now} without a copy; {"all", now, name, value, ...} with every
// field of the hash; {"bad", now, what} when it holds more fields, or a
// larger one, or more bytes, than a follower writes (see
// registry_copy_vet.go): then nothing of it is returned.
//
// KEYS[1] copy.
var readAllScript = redis.NewScript(`
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local n = redis.call('HLEN', KEYS[1])
if n == 0 then return {'none', now} end
if n > ` + strconv.Itoa(copyMaxFields+2) + ` then return {'bad', now, n .. ' fields'} end
local total = 0
for _, k in ipairs(redis.call('HKEYS', KEYS[1])) do
  if #k > ` + strconv.Itoa(copyMaxName+2) + ` then return {'bad', now, 'a field name of ' .. #k .. ' bytes'} end
  local limit = ` + strconv.Itoa(copyMaxField) + `
  if k == 'v' then limit = ` + strconv.Itoa(copyMaxVersionText) + ` elseif k == 'head' then limit = ` + strconv.Itoa(copyMaxHead) + ` end
  local size = redis.call('HSTRLEN', KEYS[1], k)
  total = total + size + #k
  if size > limit then return {'bad', now, 'a field of ' .. size .. ' bytes'} end
  if total > ` + strconv.Itoa(copyMaxBytes) + ` then return {'bad', now, 'a copy of more than ` + strconv.Itoa(copyMaxBytes) + ` bytes'} end
end
local out = {'all', now}
for _, x in ipairs(redis.call('HGETALL', KEYS[1])) do
  out[#out + 1] = x
end
return out
`)

// Read reads what changed in the copy since st (the copy this instance
// holds; an empty one reads it whole), in one round trip when the log
// covers it, the whole copy otherwise, and checks it against its head,
// and its head against Redis's clock (VetHead): a copy that fails is
// refused with a *CopyRejected, one older than st with ErrCopyStale. st
// is not changed.
func (c *RegistryCopy) Read(ctx context.Context, st *CopyState) (CopyRead, error) {
	if st.Empty() {
		return c.readAll(ctx, st)
	}
	cctx, cancel := c.leases.call(ctx)
	res, err := readSinceScript.Run(cctx, c.rdb, []string{copyKey(c.prefix), copyLogKey(c.prefix)}, st.Version).Slice()
	cancel()
	if err != nil {
		return CopyRead{}, fmt.Errorf("lock: read the registry copy: %w", err)
	}
	rd, whole, err := c.decodeSince(st, res)
	if err != nil || !whole {
		return rd, err
	}
	// Not what the head says, or not by deltas: read it whole, which
	// tells a copy rewritten meanwhile from a forged one.
	return c.readAll(ctx, st)
}

// decodeSince makes what readSinceScript brought (res) into what changed
// since st, checked; whole when the copy must be read whole to tell.
func (c *RegistryCopy) decodeSince(st *CopyState, res []any) (rd CopyRead, whole bool, err error) {
	if len(res) < 2 {
		return CopyRead{}, false, fmt.Errorf("lock: read the registry copy: unexpected reply %v", res)
	}
	kind, _ := res[0].(string)
	us, _ := res[1].(int64)
	now := time.UnixMicro(us)
	str := func(i int) string {
		if i < len(res) {
			s, _ := res[i].(string)
			return s
		}
		return ""
	}
	if kind == "none" {
		return CopyRead{}, false, ErrNoCopy
	}
	v, verr := parseCopyVersion(str(2), now)
	if verr != nil {
		v = -1
	}
	switch kind {
	case "bad":
		return CopyRead{}, false, &CopyRejected{v, copyOutOfBounds("%s", clip(str(3)))}
	case "same", "delta":
		if verr != nil {
			return CopyRead{}, false, &CopyRejected{v, verr}
		}
		h, err := c.VetHead(str(3), now)
		if err != nil {
			return CopyRead{}, false, &CopyRejected{v, err}
		}
		if kind == "same" {
			if h.Term == st.Term && h.Version == st.Version && st.matches(h) {
				return CopyRead{Head: h, State: st, Now: now}, false, nil
			}
			return CopyRead{}, true, nil
		}
		fields := make(map[string][]byte, (len(res)-4)/2)
		for i := 4; i+1 < len(res); i += 2 {
			name, _ := res[i].(string)
			var val []byte
			if s, ok := res[i+1].(string); ok {
				val = []byte(s)
			}
			fields[name] = val
		}
		if err := fieldsInBounds(fields); err != nil {
			return CopyRead{}, false, &CopyRejected{v, err}
		}
		n := c.with(st, fields, false)
		n.Term, n.Version, n.prev, n.seen, n.alive, n.registry = h.Term, h.Version, h.Prev, h.Seen, h.Alive, h.Registry
		if h.Term == st.Term && h.Version == v && n.matches(h) {
			return CopyRead{Head: h, Fields: fields, State: n, Now: now}, false, nil
		}
	}
	return CopyRead{}, true, nil
}

// fieldsInBounds checks fields against the bounds the scripts hold them
// to (they refuse what is larger before it leaves Redis).
func fieldsInBounds(fields map[string][]byte) error {
	if len(fields) > copyMaxFields {
		return copyOutOfBounds("%d fields", len(fields))
	}
	total := 0
	for name, v := range fields {
		total += len(name) + len(v)
		switch {
		case len(name) > copyMaxName:
			return copyOutOfBounds("a field name of %d bytes", len(name))
		case len(v) > copyMaxField:
			return copyOutOfBounds("a field of %d bytes", len(v))
		case total > copyMaxBytes:
			return copyOutOfBounds("a copy of more than %d bytes", copyMaxBytes)
		}
	}
	return nil
}

// readAll reads the whole copy in one script and checks it.
func (c *RegistryCopy) readAll(ctx context.Context, st *CopyState) (CopyRead, error) {
	ctx, cancel := c.leases.call(ctx)
	defer cancel()
	res, err := readAllScript.Run(ctx, c.rdb, []string{copyKey(c.prefix)}).Slice()
	if err != nil {
		return CopyRead{}, fmt.Errorf("lock: read the registry copy: %w", err)
	}
	return c.decodeAll(st, res)
}

// decodeAll makes what readAllScript brought (res) into the copy it holds,
// checked against its head and st.
func (c *RegistryCopy) decodeAll(st *CopyState, res []any) (CopyRead, error) {
	if len(res) < 2 {
		return CopyRead{}, fmt.Errorf("lock: read the registry copy: unexpected reply %v", res)
	}
	kind, _ := res[0].(string)
	us, _ := res[1].(int64)
	now := time.UnixMicro(us)
	switch kind {
	case "none":
		return CopyRead{}, ErrNoCopy
	case "bad":
		what, _ := res[min(2, len(res)-1)].(string)
		return CopyRead{}, &CopyRejected{-1, copyOutOfBounds("%s", clip(what))}
	}
	var vs, head string
	hasV := false
	fields := make(map[string][]byte, len(res)/2)
	for i := 2; i+1 < len(res); i += 2 {
		k, _ := res[i].(string)
		val, _ := res[i+1].(string)
		switch {
		case k == "v":
			vs, hasV = val, true
		case k == "head":
			head = val
		default:
			if name, ok := strings.CutPrefix(k, "f:"); ok {
				fields[name] = []byte(val)
			}
		}
	}
	if !hasV {
		return CopyRead{}, ErrNoCopy
	}
	if err := fieldsInBounds(fields); err != nil {
		return CopyRead{}, &CopyRejected{-1, err}
	}
	v, err := parseCopyVersion(vs, now)
	if err != nil {
		return CopyRead{}, &CopyRejected{-1, err}
	}
	h, err := c.VetHead(head, now)
	if err != nil {
		return CopyRead{}, &CopyRejected{v, err}
	}
	n := c.with(&CopyState{}, fields, true)
	n.Term, n.Version, n.prev, n.seen, n.alive, n.registry = h.Term, h.Version, h.Prev, h.Seen, h.Alive, h.Registry
	switch {
	case h.Version != v:
		return CopyRead{}, &CopyRejected{v, fmt.Errorf("the head is of version %d", h.Version)}
	case !n.matches(h):
		return CopyRead{}, &CopyRejected{v, errors.New("its fields do not make the digest of its head")}
	case st.Empty():
	case h.Term < st.Term || h.Term == st.Term && h.Version < st.Version:
		return CopyRead{}, ErrCopyStale
	case h.Term == st.Term && h.Version == st.Version:
		if n.digest != st.digest {
			return CopyRead{}, &CopyRejected{v, errors.New("another copy under the version applied")}
		}
		return CopyRead{Head: h, State: st, Now: now}, nil
	}
	return CopyRead{Head: h, Fields: fields, Full: true, State: n, Now: now}, nil
}

// Check reads the whole copy and reports, as an error, how it differs
// from st, the copy as this follower wrote it: for a follower to find a
// copy that someone else changed, and write it whole again. A copy that
// differs is ErrNoCopy, a *CopyRejected or ErrCopyDiffers; any other
// error is Redis's.
func (c *RegistryCopy) Check(ctx context.Context, st *CopyState) error {
	r, err := c.readAll(ctx, &CopyState{})
	if err != nil {
		return err
	}
	if r.State.Term != st.Term || r.State.Version != st.Version || r.State.digest != st.digest || len(r.State.elems) != len(st.elems) {
		return fmt.Errorf("%w: it is term %d version %d, the one written term %d version %d",
			ErrCopyDiffers, r.State.Term, r.State.Version, st.Term, st.Version)
	}
	return nil
}

// Watch calls news with each version published and with 0 on each
// (re)subscription, when what was published meanwhile is lost, until ctx
// is done; it returns ctx's error. A message that is no version (larger
// than one, or not a positive number) goes to bad instead, unread. As
// Subscribe does, every echoEvery it checks with a marker of its own that
// the subscription still hears what is published, and subscribes again
// when it does not.
//
// A version is not checked against Redis's clock here (no clock comes
// with a message): ParseCopyVersion does, with the caller's last reading.
func (c *RegistryCopy) Watch(ctx context.Context, news func(version int64), bad func(error)) error {
	echo, err := echoChannel(c.prefix)
	if err != nil {
		return err
	}
	check := time.NewTicker(echoEvery)
	defer check.Stop()
	for {
		if err := c.watchOnce(ctx, echo, check.C, news, bad); err != nil {
			return err
		}
	}
}

// watchOnce runs one subscription until ctx is done (its error is
// returned) or the subscription is found deaf (nil).
func (c *RegistryCopy) watchOnce(ctx context.Context, echo string, check <-chan time.Time, news func(int64), bad func(error)) error {
	ch := copyChannel(c.prefix)
	ps := c.rdb.Subscribe(ctx, ch, echo)
	defer ps.Close()
	msgs := ps.ChannelWithSubscriptions(
		redis.WithChannelHealthCheckInterval(time.Second),
		redis.WithChannelPingTimeout(CallTimeout),
		redis.WithChannelReconnectTimeout(CallTimeout),
	)
	pending := false
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-check:
			if pending {
				return nil
			}
			cctx, cancel := c.leases.call(ctx)
			pending = c.rdb.Publish(cctx, echo, "echo").Err() == nil
			cancel()
		case m, ok := <-msgs:
			if !ok {
				return fmt.Errorf("lock: subscription to %q closed", ch)
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" && m.Channel == ch {
					news(0)
				}
			case *redis.Message:
				// Any message heard shows the subscription hears: one
				// far behind a flood of them is not deaf, only late.
				pending = false
				if m.Channel == echo {
					continue
				}
				if v, err := parseVersionText(m.Payload); err == nil {
					news(v)
				} else {
					bad(fmt.Errorf("a message on %q: %w", ch, err))
				}
			}
		}
	}
}
