// Package lock coordinates a fleet of instances through Redis: leases per
// key, taken with SET NX PX and a random token per instance and renewed and
// released by compare-and-set scripts; status writes fenced by the lease and
// published in the same script; and a subscriber that applies published
// statuses in version order and resynchronises from the stored ones on every
// (re)subscription and on a timer.
//
// It knows nothing of DNS: keys and statuses are opaque to it.
package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// CallTimeout bounds every Redis call this package makes, so that a Redis
// that is gone or frozen costs the caller at most this long per call.
const CallTimeout = 500 * time.Millisecond

// tokenBytes is the length of an instance's random token, in bytes.
const tokenBytes = 16

// Leases takes, renews and releases leases on keys under a prefix, on behalf
// of one instance identified by a random token. Its methods are safe for
// concurrent use.
type Leases struct {
	rdb    redis.UniversalClient
	prefix string
	token  string
}

// NewLeases returns the leases of a new instance on rdb, with key names
// under prefix and a fresh random token.
func NewLeases(rdb redis.UniversalClient, prefix string) (*Leases, error) {
	if err := checkClient(rdb); err != nil {
		return nil, err
	}
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("lock: cannot draw a random token: %w", err)
	}
	return &Leases{rdb: rdb, prefix: prefix, token: hex.EncodeToString(b)}, nil
}

// Token returns this instance's token, the value stored in the leases it holds.
func (l *Leases) Token() string { return l.token }

// renewScript extends a lease only while it holds our token.
var renewScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// releaseScript deletes a lease only while it holds our token.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

// Acquire takes the lease on key for ttl if nobody holds it. It reports
// whether the lease is now ours; a lease we already hold is not extended
// (use Renew).
func (l *Leases) Acquire(ctx context.Context, key string, ttl time.Duration) (bool, error) {
	if err := checkTTL(ttl); err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	ok, err := l.rdb.SetNX(ctx, leaseKey(l.prefix, key), l.token, ttl).Result()
	if err != nil {
		return false, fmt.Errorf("lock: acquire %q: %w", key, err)
	}
	return ok, nil
}

// Renew extends the lease on key to ttl from now, only while it is ours. It
// reports false when the lease has expired or another instance holds it.
func (l *Leases) Renew(ctx context.Context, key string, ttl time.Duration) (bool, error) {
	if err := checkTTL(ttl); err != nil {
		return false, err
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	n, err := renewScript.Run(ctx, l.rdb, []string{leaseKey(l.prefix, key)}, l.token, ttl.Milliseconds()).Int64()
	if err != nil {
		return false, fmt.Errorf("lock: renew %q: %w", key, err)
	}
	return n == 1, nil
}

// Release gives up the lease on key, only while it is ours. It reports
// whether a lease of ours was deleted.
func (l *Leases) Release(ctx context.Context, key string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	n, err := releaseScript.Run(ctx, l.rdb, []string{leaseKey(l.prefix, key)}, l.token).Int64()
	if err != nil {
		return false, fmt.Errorf("lock: release %q: %w", key, err)
	}
	return n == 1, nil
}

// checkClient refuses a client that would not honour CallTimeout: go-redis
// ignores a context's deadline unless ContextTimeoutEnabled is set, and
// falls back to its read and write timeouts.
func checkClient(rdb redis.UniversalClient) error {
	if rdb == nil {
		return errors.New("lock: no Redis client given")
	}
	enabled := true
	switch c := rdb.(type) {
	case *redis.Client:
		enabled = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		enabled = c.Options().ContextTimeoutEnabled
	}
	if !enabled {
		return errors.New("lock: the Redis client ignores context deadlines, so a frozen Redis would stall every call; set ContextTimeoutEnabled in its options")
	}
	return nil
}

func checkTTL(ttl time.Duration) error {
	if ttl < time.Millisecond {
		return fmt.Errorf("lock: lease TTL %v is below the 1ms Redis can keep; give a TTL of a few check intervals", ttl)
	}
	return nil
}
