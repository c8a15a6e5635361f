// Package lock coordinates a fleet of instances through Redis: leases per
// key, taken with SET NX PX and a random token per instance and renewed and
// released by compare-and-set scripts; status writes fenced by the lease and
// published in the same script, each publish numbered by its holder, whose
// membership heartbeat stores the number of its last (its watermark); and a
// subscriber that applies published statuses in version order and reads the
// stored ones on every (re)subscription. A Coordinator reads a holder's
// statuses again only when its watermark shows a publish not heard (a
// gap), and every status only as a slow safety net: its Redis work at
// steady state does not grow with the targets, the fleet's is its status
// writes (one per target per interval) and a few calls per instance.
//
// Redis is not trusted: whoever can write to it may not hold the fleet's
// redis_secret, and an accident may leave anything there. So everything
// read from it is vetted before it counts, and what fails is treated as
// absent (the key is probed here, as without a status), never as newest,
// and is rewritten by its rightful writer:
//
//   - A status carries its version inside its signature (with a secret): a
//     version changed, or a status replayed under another version or key,
//     is refused. Versions are Redis's clock in µs: the writer proposes
//     one, and the write script takes it only above the stored one and not
//     more than a lease (Config's lease TTL) ahead of Redis's TIME,
//     treating a stored version further ahead as absent; readers refuse a
//     version, a write time or a probe time more than a lease ahead of
//     Redis's clock as they know it (the offset measured at each
//     heartbeat), and forget a key's last version once it is that far
//     ahead. A single write of a huge version can thus neither stop the
//     versions moving (Lua's numbers are exact only below 2^53) nor make
//     the real statuses look stale for more than a lease.
//   - A status covers its key (the others do not probe it) only while its
//     writer is the live member the fleet gives the key to (or, for a
//     handover after its write, a live member that still hands the key
//     over to it: see bounds.handover) and no gap in
//     its writer's publishes has gone unrepaired for longer than a
//     handoff (an interval, a probe and a cycle); one read from the store counts only when written
//     within a rewrite period (five intervals), an interval, a probe, a
//     cycle and a Redis call (its holder rewrites it at least that often,
//     so an older one is an old one stored again); a holder that finds its stored status written by someone
//     else publishes its own again. A publish number or watermark counts
//     only signed (with a secret), and one heard above its holder's
//     watermark for longer than two cycles and two Redis calls is
//     forgotten.
//   - A member entry and its watermark are signed with the secret and
//     keyed to the prefix; a member entry
//     whose membership would last more than a member TTL and a lease is
//     dropped by every heartbeat. A lease without a TTL or with one over two
//     lease TTLs is void: the member the fleet gives the key to takes it
//     over at its next round; so it does, from its second round, with a
//     lease held by no live member, and after a lease with one a live
//     member keeps from it (a holder the fleet moved a key away from
//     hands it over as soon as the new owner takes it, naming it).
//   - A message or stored status over MaxStatusBytes is refused before it
//     is decoded; a key of a type the scripts do not write is treated as
//     absent rather than making them fail. Every refusal is counted
//     (Observer.Message "rejected") and logged at most once per kind per
//     minute (internal/ratelog).
//
// Without a secret the same bounds apply: whoever can write to Redis can
// then forge a status, but no single write holds the fleet for longer than
// the bounds, and an accident cannot freeze it. The secret adds that no
// status, version or member counts unless an instance of the fleet wrote
// it.
//
// Redis calls of a Coordinator's Leases have a deadline that adapts to the
// latency seen (latency: four times a decaying maximum of the calls'
// durations, within CallTimeout and the outage window, at most
// MaxCallTimeout), and a failed or slow call is not an outage: a
// Coordinator goes local only when its calls keep failing for two
// heartbeat cycles from the first failure of a streak, a call sent after
// it failing too and none answered (bounds.outageAfter, see failed), and
// then probes no target at once (each at its own tick), so that a fleet's
// probe rate rises over an interval. Targets' owners are computed again only when the live
// members or the targets change. A fleet started at once joins first (its
// first heartbeat given the same two cycles of failed calls), then takes
// its leases staggered over a cycle, and a target whose owner changed is
// left to its new owner for a handoff, so that neither a start nor a
// member coming or going has every instance probe what moved; coming back
// after an outage, an instance takes its leases again without probing
// them at once.
//
// It knows nothing of DNS: keys are opaque to it.
package lock

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// CallTimeout bounds every Redis call this package makes, so that a Redis
// that is gone or frozen costs the caller at most this long per call; the
// calls an instance makes again and again (those of Leases, Subscriber
// and RegistryCopy), their least deadline: it adapts to the latency seen,
// up to MaxCallTimeout (see latency).
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
	secret []byte // signs this instance's member entry, checks the others'
	name   string // this instance's host and DNS listener, stored beside its membership; "" for none
	lat    latency
	// seq numbers this instance's publishes (the last number given);
	// sent is the highest of them Redis confirmed published, its
	// watermark, which each heartbeat stores.
	seq, sent atomic.Uint64
}

// NewLeases returns the leases of a new instance on rdb, with key names
// under prefix and a fresh random token.
func NewLeases(rdb redis.UniversalClient, prefix string) (*Leases, error) {
	return leasesOf(rdb, prefix, "")
}

// leasesOf returns the leases of an instance on rdb under prefix, whose
// token is token ("" draws a fresh one).
func leasesOf(rdb redis.UniversalClient, prefix, token string) (*Leases, error) {
	if err := checkClient(rdb); err != nil {
		return nil, err
	}
	if token == "" {
		var err error
		if token, err = NewToken(); err != nil {
			return nil, err
		}
	}
	return &Leases{rdb: rdb, prefix: prefix, token: token}, nil
}

// NewToken draws a fresh random token: what names an instance in Redis
// (the value of the leases it holds, its membership), shared by its
// Coordinator and its RegistryCopy (Config.Token, NewRegistryCopy) so
// that one instance shows as one token.
func NewToken() (string, error) {
	b := make([]byte, tokenBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("lock: cannot draw a random token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// Token returns this instance's token, the value stored in the leases it holds.
func (l *Leases) Token() string { return l.token }

// renewScript extends a lease only while it holds our token. (A lease key
// of another type is anyone's write: pcall makes it not ours rather than
// an error, here and in every script that reads a lease.)
var renewScript = redis.NewScript(`
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// releaseScript deletes a lease only while it holds our token.
var releaseScript = redis.NewScript(`
if redis.pcall('GET', KEYS[1]) == ARGV[1] then
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
	ctx, done := l.call(ctx)
	defer done()
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
	ctx, done := l.call(ctx)
	defer done()
	n, err := renewScript.Run(ctx, l.rdb, []string{leaseKey(l.prefix, key)}, l.token, ttl.Milliseconds()).Int64()
	if err != nil {
		return false, fmt.Errorf("lock: renew %q: %w", key, err)
	}
	return n == 1, nil
}

// Release gives up the lease on key, only while it is ours. It reports
// whether a lease of ours was deleted.
func (l *Leases) Release(ctx context.Context, key string) (bool, error) {
	ctx, done := l.call(ctx)
	defer done()
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
