package lock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
)

// Fleet is what Redis holds of a fleet under a prefix, read at one moment
// by ReadFleet: for tools that show it (cmd/pgclusterctl).
type Fleet struct {
	// Now is Redis's clock when the fleet was read: leases and memberships
	// are measured by it.
	Now time.Time
	// Members are the live instances, in token order.
	Members []Member
	// Keys holds, by key, the lease and status of every key asked for and
	// of every key with a stored status.
	Keys map[string]KeyState
}

// Member is a live instance of the fleet.
type Member struct {
	Token string    // the instance's token: the value of the leases it holds
	Until time.Time // when its membership lapses unless it renews it (Redis's clock)
}

// KeyState is what Redis holds for one key.
type KeyState struct {
	// Holder is the token of the instance holding the key's lease, "" when
	// nobody does; LeaseLeft is what is left of the lease.
	Holder    string
	LeaseLeft time.Duration
	// Version is the stored status's version, 0 when none is stored.
	Version int64
	// Status is the stored status, nil when none is stored or it was
	// refused (Err says why: unreadable, unsigned, wrongly signed), as
	// every instance would refuse it.
	Status *Status
	Err    error
}

// Status is a stored status: the verdict its holder reached on a target.
type Status struct {
	Addr     netip.AddrPort // the address the holder probed
	Holder   string         // the token of the instance that wrote it
	At       time.Time      // the holder's clock at the write
	Progress health.Progress
}

// Live reports whether token is a live member of the fleet.
func (f *Fleet) Live(token string) bool {
	for _, m := range f.Members {
		if m.Token == token {
			return true
		}
	}
	return false
}

// ReadFleet reads, without writing anything, the fleet under prefix on
// rdb: Redis's clock, the live members, and the lease and stored status of
// each of keys and of every key with a stored status. Statuses are decoded
// as the instances decode them: with secret, one without its valid
// signature is refused (KeyState.Err). Each Redis call is bounded by
// CallTimeout; the first that fails ends the read with its error.
func ReadFleet(ctx context.Context, rdb redis.UniversalClient, prefix string, secret []byte, keys []string) (*Fleet, error) {
	if err := checkClient(rdb); err != nil {
		return nil, err
	}
	f := &Fleet{Keys: map[string]KeyState{}}
	cctx, cancel := context.WithTimeout(ctx, CallTimeout)
	now, err := rdb.Time(cctx).Result()
	cancel()
	if err != nil {
		return nil, fmt.Errorf("lock: read Redis's clock: %w", err)
	}
	f.Now = now
	if f.Members, err = readMembers(ctx, rdb, prefix, now); err != nil {
		return nil, err
	}

	sub, err := NewSubscriber(rdb, prefix, DefaultResync)
	if err != nil {
		return nil, err
	}
	stored, err := sub.ReadAll(ctx)
	if err != nil {
		return nil, err
	}
	for _, s := range stored {
		ks := KeyState{Version: s.Version}
		st, err := decode(s.Key, s.Status, secret)
		if err != nil {
			ks.Err = err
		} else {
			ks.Status = &Status{Addr: st.Addr, Holder: st.Holder, At: time.UnixMicro(st.At), Progress: st.progress()}
		}
		f.Keys[s.Key] = ks
	}
	for _, k := range keys {
		if _, ok := f.Keys[k]; !ok {
			f.Keys[k] = KeyState{}
		}
	}
	if err := readLeases(ctx, rdb, prefix, f.Keys); err != nil {
		return nil, err
	}
	return f, nil
}

// readMembers reads the members whose membership has not lapsed at now.
func readMembers(ctx context.Context, rdb redis.UniversalClient, prefix string, now time.Time) ([]Member, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	zs, err := rdb.ZRangeByScoreWithScores(ctx, membersKey(prefix), &redis.ZRangeBy{
		Min: strconv.FormatInt(now.UnixMilli(), 10), Max: "+inf",
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("lock: read the members under %q: %w", prefix, err)
	}
	var ms []Member
	for _, z := range zs {
		if tok, ok := z.Member.(string); ok {
			ms = append(ms, Member{Token: tok, Until: time.UnixMilli(int64(z.Score))})
		}
	}
	slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.Token, b.Token) })
	return ms, nil
}

// readLeases reads, in one round trip, the holder and what is left of the
// lease of every key of ks.
func readLeases(ctx context.Context, rdb redis.UniversalClient, prefix string, ks map[string]KeyState) error {
	if len(ks) == 0 {
		return nil
	}
	keys := slices.Sorted(maps.Keys(ks))
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	gets := make([]*redis.StringCmd, len(keys))
	ttls := make([]*redis.DurationCmd, len(keys))
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			gets[i] = p.Get(ctx, leaseKey(prefix, k))
			ttls[i] = p.PTTL(ctx, leaseKey(prefix, k))
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("lock: read %d leases under %q: %w", len(keys), prefix, err)
	}
	for i, k := range keys {
		s := ks[k]
		if tok, err := gets[i].Result(); err == nil {
			s.Holder = tok
			if d, err := ttls[i].Result(); err == nil && d > 0 {
				s.LeaseLeft = d
			}
		}
		ks[k] = s
	}
	return nil
}
