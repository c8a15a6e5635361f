package lock

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
)

// Fleet is what Redis holds of a fleet under a prefix, read at one moment
// by ReadFleet and vetted as every instance vets it: for tools that show
// it (cmd/pgclusterctl).
type Fleet struct {
	// Now is Redis's clock when the fleet was read: leases, memberships
	// and statuses are measured by it.
	Now time.Time
	// Members are the live instances, in token order: those whose entry
	// passed vetting (signed with the secret when there is one, and not
	// lapsing further ahead than an instance makes it).
	Members []Member
	// Refused says why each member entry that did not pass was refused:
	// no instance counts it.
	Refused []string
	// Cover is how old a stored status may be and still cover its key:
	// its holder rewrites it at least every five intervals, at once when
	// it changes (see KeyState.Stale).
	Cover time.Duration
	// Keys holds, by key, the lease and status of every key asked for and
	// of every key with a stored status.
	Keys map[string]KeyState
}

// Member is a live instance of the fleet.
type Member struct {
	Token string    // the instance's token: the value of the leases it holds
	Until time.Time // when its membership lapses unless it renews it (Redis's clock)
	// Name is the host and DNS listener the instance stored beside its
	// membership (Config.Name; signed with the secret when there is one),
	// "" when it stored none or its name was refused (NameErr says why).
	Name    string
	NameErr error
}

// KeyState is what Redis holds for one key.
type KeyState struct {
	// Holder is the token of the instance holding the key's lease, "" when
	// nobody does; LeaseLeft is what is left of the lease. A lease that
	// is anyone's write (without a TTL, or with one longer than an
	// instance sets) counts as none: LeaseErr says why, and the instance
	// the fleet gives the key to takes it over.
	Holder    string
	LeaseLeft time.Duration
	LeaseErr  error
	// Version is the stored status's version, 0 when none is stored.
	Version int64
	// Status is the stored status, nil when none is stored or it was
	// refused (Err says why: unreadable, unsigned, wrongly signed, a
	// version not the signed one, ahead of Redis's clock), as every
	// instance would refuse it.
	Status *Status
	Err    error
	// Stale, when not "", says why Status does not cover the key (its
	// writer is not a live member or no longer holds the key, or it is
	// older than Fleet.Cover): an instance reading it now would not
	// answer from it, but probe the node itself.
	Stale string
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

// VetStatus vets a status of key as stored or published with version, by
// Redis's clock now, exactly as an instance with cfg's options does before
// the status counts: decoded, signed with cfg.Secret when set, its signed
// version the one it came with, and neither that version nor its times
// more than a lease ahead of now.
func (cfg Config) VetStatus(key string, version int64, stored []byte, now time.Time) (*Status, error) {
	b, err := cfg.bounds()
	if err != nil {
		return nil, err
	}
	st, err := vetStatus(cfg.macKey(key), version, stored, cfg.Secret, now.UnixMicro(), b.ttl)
	if err != nil {
		return nil, err
	}
	return &Status{Addr: st.Addr, Holder: st.Holder, At: time.UnixMicro(st.At), Progress: st.progress()}, nil
}

// ReadFleet reads, without writing anything, the fleet of cfg (its
// Prefix, Secret, Interval and Timeout: the fleet's) on rdb: Redis's
// clock, the live members, and the lease and stored status of each of
// keys and of every key with a stored status. What it reads is vetted as
// the instances vet it (VetStatus, the members' signatures and bounds,
// void leases), and each status is marked stale when it does not cover its
// key, as an instance judges it. Each Redis call is bounded by
// CallTimeout; the first that fails ends the read with its error.
func ReadFleet(ctx context.Context, rdb redis.UniversalClient, cfg Config, keys []string) (*Fleet, error) {
	if err := checkClient(rdb); err != nil {
		return nil, err
	}
	b, err := cfg.bounds()
	if err != nil {
		return nil, err
	}
	f := &Fleet{Keys: map[string]KeyState{}, Cover: b.storedAge()}
	cctx, cancel := context.WithTimeout(ctx, CallTimeout)
	now, err := rdb.Time(cctx).Result()
	cancel()
	if err != nil {
		return nil, fmt.Errorf("lock: read Redis's clock: %w", err)
	}
	f.Now = now
	if err := readMembers(ctx, rdb, cfg, b, f); err != nil {
		return nil, err
	}
	live := map[string]bool{}
	var tokens []string
	for _, m := range f.Members {
		live[m.Token] = true
		tokens = append(tokens, m.Token)
	}

	sub, err := NewSubscriber(rdb, cfg.Prefix, DefaultResync)
	if err != nil {
		return nil, err
	}
	stored, err := sub.ReadAll(ctx)
	if err != nil {
		return nil, err
	}
	rank := newRanking(tokens)
	for _, s := range stored {
		ks := KeyState{Version: s.Version, Err: s.Err}
		if ks.Err == nil {
			ks.Status, ks.Err = cfg.VetStatus(s.Key, s.Version, s.Status, now)
		}
		if ks.Status != nil {
			ks.Stale = b.stale(ks.Status.Holder, rank.owner(s.Key), s.Version, s.Version, live, now.UnixMicro(), b.storedAge())
		}
		f.Keys[s.Key] = ks
	}
	for _, k := range keys {
		if _, ok := f.Keys[k]; !ok {
			f.Keys[k] = KeyState{}
		}
	}
	if err := readLeases(ctx, rdb, cfg.Prefix, b, f.Keys); err != nil {
		return nil, err
	}
	return f, nil
}

// readMembers reads the members whose membership has not lapsed at f.Now,
// at most maxMembers, into f: those that pass vetting as the instances'
// heartbeat vets them into Members, the others into Refused.
func readMembers(ctx context.Context, rdb redis.UniversalClient, cfg Config, b bounds, f *Fleet) error {
	cctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	zs, err := rdb.ZRangeByScoreWithScores(cctx, membersKey(cfg.Prefix), &redis.ZRangeBy{
		Min: strconv.FormatInt(f.Now.UnixMilli(), 10), Max: "+inf", Count: maxMembers,
	}).Result()
	if err != nil && replyError(err) {
		// Not a sorted set: anyone's write, which the instances'
		// next heartbeat replaces.
		f.Refused = append(f.Refused, "the members key is not a sorted set: "+err.Error())
		return nil
	}
	if err != nil {
		return fmt.Errorf("lock: read the members under %q: %w", cfg.Prefix, err)
	}
	limit := f.Now.Add(b.memberAhead())
	entries := map[string]string{} // member entry by token
	for _, z := range zs {
		entry, _ := z.Member.(string)
		until := time.UnixMilli(int64(min(z.Score, float64(math.MaxInt64/2))))
		tok, err := memberToken(entry, cfg.Prefix, cfg.Secret)
		switch {
		case err != nil:
			f.Refused = append(f.Refused, err.Error())
		case until.After(limit):
			f.Refused = append(f.Refused, fmt.Sprintf("member %s lapses %v from now, further than any instance sets (%v)",
				quoteRedis(tok), until.Sub(f.Now).Round(time.Second), b.memberAhead()))
		case !slices.ContainsFunc(f.Members, func(m Member) bool { return m.Token == tok }):
			f.Members = append(f.Members, Member{Token: tok, Until: until})
			entries[tok] = entry
		}
	}
	slices.SortFunc(f.Members, func(a, b Member) int { return strings.Compare(a.Token, b.Token) })
	return readNames(ctx, rdb, cfg, f.Members, entries)
}

// readNames reads the names the members stored beside their membership
// (see Config.Name), vetted: one refused is not shown, and NameErr says
// why.
func readNames(ctx context.Context, rdb redis.UniversalClient, cfg Config, members []Member, entries map[string]string) error {
	if len(members) == 0 {
		return nil
	}
	fields := make([]string, len(members))
	for i, m := range members {
		fields[i] = entries[m.Token]
	}
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	vals, err := rdb.HMGet(ctx, namesKey(cfg.Prefix), fields...).Result()
	if err != nil && replyError(err) {
		return nil // not a hash: anyone's write, which the next heartbeat replaces
	}
	if err != nil {
		return fmt.Errorf("lock: read the members' names under %q: %w", cfg.Prefix, err)
	}
	for i, v := range vals {
		if s, ok := v.(string); ok && i < len(members) {
			members[i].Name, members[i].NameErr = nameOf(s, members[i].Token, cfg.Prefix, cfg.Secret)
		}
	}
	return nil
}

// readLeases reads, in one round trip, the holder and what is left of the
// lease of every key of ks. A lease without a TTL, or with one over
// twice a lease's (the bound the instances' take script applies), is
// void.
func readLeases(ctx context.Context, rdb redis.UniversalClient, prefix string, b bounds, ks map[string]KeyState) error {
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
	if err != nil && !replyError(err) {
		return fmt.Errorf("lock: read %d leases under %q: %w", len(keys), prefix, err)
	}
	for i, k := range keys {
		s := ks[k]
		tok, err := gets[i].Result()
		if errors.Is(err, redis.Nil) {
			ks[k] = s
			continue
		}
		left, terr := ttls[i].Result()
		switch {
		case err != nil:
			s.LeaseErr = errors.New("the lease key is not a string: anyone's write, taken over by the instance the fleet gives the key to")
		case terr != nil || left < 0:
			s.LeaseErr = fmt.Errorf("lease held by %s without a TTL: anyone's write, taken over by the instance the fleet gives the key to", quoteRedis(tok))
		case left > 2*b.ttl:
			s.LeaseErr = fmt.Errorf("lease held by %s for %v, longer than any instance sets (%v): anyone's write, taken over by the instance the fleet gives the key to", quoteRedis(tok), left.Round(time.Second), 2*b.ttl)
		default:
			s.Holder, s.LeaseLeft = tok, left
		}
		ks[k] = s
	}
	return nil
}
