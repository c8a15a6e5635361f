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
}

// readSinceScript reads what changed since version ARGV[1]: {"none"}
// without a copy; {"same", v, head}; {"gap", v} when the log does not
// lead from ARGV[1] to v by deltas alone; {"delta", v, head, name, value,
// ...} with every field the versions since changed (false: deleted).
//
// KEYS[1] copy, KEYS[2] log.
var readSinceScript = redis.NewScript(`
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return {'none'} end
if v == ARGV[1] then return {'same', v, redis.call('HGET', KEYS[1], 'head') or ''} end
local es = redis.call('ZRANGE', KEYS[2], '(' .. ARGV[1], '+inf', 'BYSCORE')
local expect = ARGV[1]
local names, seen = {}, {}
for _, e in ipairs(es) do
  local ev, prev, kind, rest = string.match(e, '^(%d+) (%d+) ([*=])(.*)$')
  if not ev or prev ~= expect or kind ~= '=' then return {'gap', v} end
  for name in string.gmatch(rest, '[^%z]+') do
    if not seen[name] then
      seen[name] = true
      names[#names + 1] = name
    end
  end
  expect = ev
end
if expect ~= v then return {'gap', v} end
local out = {'delta', v, redis.call('HGET', KEYS[1], 'head') or ''}
for _, name in ipairs(names) do
  out[#out + 1] = name
  out[#out + 1] = redis.call('HGET', KEYS[1], 'f:' .. name) or false
end
return out
`)

// Read reads what changed in the copy since st (the copy this instance
// holds; an empty one reads it whole), in one round trip when the log
// covers it, the whole copy otherwise, and checks it against its head:
// a copy that fails is refused with a *CopyRejected, one older than st
// with ErrCopyStale. st is not changed.
func (c *RegistryCopy) Read(ctx context.Context, st *CopyState) (CopyRead, error) {
	if st.Empty() {
		return c.readAll(ctx, st)
	}
	cctx, cancel := context.WithTimeout(ctx, CallTimeout)
	res, err := readSinceScript.Run(cctx, c.rdb, []string{copyKey(c.prefix), copyLogKey(c.prefix)}, st.Version).Slice()
	cancel()
	if err != nil {
		return CopyRead{}, fmt.Errorf("lock: read the registry copy: %w", err)
	}
	kind, _ := res[0].(string)
	var v int64
	if len(res) > 1 {
		vs, _ := res[1].(string)
		v, _ = strconv.ParseInt(vs, 10, 64)
	}
	switch kind {
	case "none":
		return CopyRead{}, ErrNoCopy
	case "same":
		raw, _ := res[2].(string)
		h, err := c.DecodeHead(raw)
		if err != nil {
			return CopyRead{}, &CopyRejected{v, err}
		}
		if h.Term == st.Term && h.Version == st.Version && st.matches(h) {
			return CopyRead{Head: h, State: st}, nil
		}
	case "delta":
		raw, _ := res[2].(string)
		h, err := c.DecodeHead(raw)
		if err != nil {
			return CopyRead{}, &CopyRejected{v, err}
		}
		fields := make(map[string][]byte, (len(res)-3)/2)
		for i := 3; i+1 < len(res); i += 2 {
			name, _ := res[i].(string)
			var val []byte
			if s, ok := res[i+1].(string); ok {
				val = []byte(s)
			}
			fields[name] = val
		}
		n := c.with(st, fields, false)
		n.Term, n.Version, n.prev, n.seen = h.Term, h.Version, h.Prev, h.Seen
		if h.Term == st.Term && h.Version == v && n.matches(h) {
			return CopyRead{Head: h, Fields: fields, State: n}, nil
		}
		// Not what the head says: read it whole, which tells a copy
		// rewritten meanwhile from a forged one.
	}
	return c.readAll(ctx, st)
}

// readAll reads the whole copy in one command and checks it.
func (c *RegistryCopy) readAll(ctx context.Context, st *CopyState) (CopyRead, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	all, err := c.rdb.HGetAll(ctx, copyKey(c.prefix)).Result()
	if err != nil {
		return CopyRead{}, fmt.Errorf("lock: read the registry copy: %w", err)
	}
	vs, ok := all["v"]
	if !ok {
		return CopyRead{}, ErrNoCopy
	}
	v, _ := strconv.ParseInt(vs, 10, 64)
	h, err := c.DecodeHead(all["head"])
	if err != nil {
		return CopyRead{}, &CopyRejected{v, err}
	}
	fields := make(map[string][]byte, len(all))
	for k, val := range all {
		if name, ok := strings.CutPrefix(k, "f:"); ok {
			fields[name] = []byte(val)
		}
	}
	n := c.with(&CopyState{}, fields, true)
	n.Term, n.Version, n.prev, n.seen = h.Term, h.Version, h.Prev, h.Seen
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
		return CopyRead{Head: h, State: st}, nil
	}
	return CopyRead{Head: h, Fields: fields, Full: true, State: n}, nil
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
// is done; it returns ctx's error. As Subscribe does, every echoEvery it
// checks with a marker of its own that the subscription still hears what
// is published, and subscribes again when it does not.
func (c *RegistryCopy) Watch(ctx context.Context, news func(version int64)) error {
	echo, err := echoChannel(c.prefix)
	if err != nil {
		return err
	}
	check := time.NewTicker(echoEvery)
	defer check.Stop()
	for {
		if err := c.watchOnce(ctx, echo, check.C, news); err != nil {
			return err
		}
	}
}

// watchOnce runs one subscription until ctx is done (its error is
// returned) or the subscription is found deaf (nil).
func (c *RegistryCopy) watchOnce(ctx context.Context, echo string, check <-chan time.Time, news func(int64)) error {
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
			cctx, cancel := context.WithTimeout(ctx, CallTimeout)
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
				if m.Channel == echo {
					pending = false
					continue
				}
				if v, err := strconv.ParseInt(m.Payload, 10, 64); err == nil && v > 0 {
					news(v)
				}
			}
		}
	}
}
