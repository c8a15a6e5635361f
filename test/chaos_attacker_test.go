package test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/lock"
)

// Pace of the chaos run's Redis attacker.
const (
	// chaosAttackMin and chaosAttackMax bound the pause between two attacks.
	chaosAttackMin, chaosAttackMax = 200 * time.Millisecond, 800 * time.Millisecond
	// chaosHeadStorm is how long one attack overwrites the copy's head,
	// every chaosHeadEvery.
	chaosHeadStorm, chaosHeadEvery = time.Second, 5 * time.Millisecond
	// chaosGarbage is how many garbage messages one attack publishes; one
	// attack in chaosHugeOdds publishes a message of chaosHuge bytes too.
	chaosGarbage, chaosHugeOdds, chaosHuge = 500, 10, 5 << 20
	// chaosAttackCall bounds each of the attacker's Redis calls: Redis may
	// be stopped or frozen by the script.
	chaosAttackCall = 500 * time.Millisecond
	// chaosFleetLease and chaosFleetTick are a follower's registry lease
	// and renewal period (relay.go's relayLease and relayTick): what the
	// second fleet's follower the attacker plays takes and keeps.
	chaosFleetLease, chaosFleetTick = 3 * time.Second, 500 * time.Millisecond
	// chaosFleetRenewals bounds how many times it renews the lease and
	// vouches for its copy before it leaves.
	chaosFleetRenewals = 4
	// chaosFleets is how many times a run writes the second fleet's copy.
	// Every instance that meets it follows PostgreSQL itself for a hold
	// that doubles each time it leaves Redis within five minutes of its
	// last return (10 s, 20 s, 40 s: relay.go's relayHold), the other
	// attacks make it leave too, and the script's role swaps wait at most
	// chaosStepTimeout for the fleet to read Redis again: more copies
	// would outlast that wait, not make an answer wrong. The other times,
	// the second fleet's follower only takes the lease and gives it up.
	chaosFleets = 1
)

// chaosAttackerOn reports whether the chaos run has its Redis attacker:
// unless CHAOS_ATTACKER is 0.
func chaosAttackerOn() bool { return os.Getenv("CHAOS_ATTACKER") != "0" }

// chaosAttacker writes into the chaos fleet's Redis, at random, what
// someone who can write there might (the chaos fleet has no redis_secret,
// so what it vets is bounds, not signatures): the writes of TestSecurityRedis's
// attacks 1 to 8, attack 7's second fleet played by writing what its
// follower would. Neither the answers nor the judge know of it: a write
// that moves an answer shows as a wrong answer.
type chaosAttacker struct {
	rdb  *redis.Client
	keys []string // the fleet's check keys, cluster/node
	// copy is the registry copy and its log as first read: what a replay
	// writes back.
	copy    map[string]string
	copyLog []redis.Z
	// registry and fields are the fleet's registry as its copy's head
	// names it, and the copy's fields: what the second fleet's copy is
	// made from. Empty until a copy of the fleet's was read.
	registry string
	fields   map[string][]byte
	// fleets is how many times the second fleet's copy was written
	// (touched by the attacking goroutine only).
	fleets int

	mu     sync.Mutex
	counts map[string]int // writes Redis took, by attack
	failed int            // writes Redis did not take (stopped, frozen)
}

// attack starts the attacker and returns the function that stops it.
func (r *chaosRun) attack() (stop func()) {
	a := &chaosAttacker{rdb: redis.NewClient(&redis.Options{Addr: r.rs.Addr(), ContextTimeoutEnabled: true}), counts: map[string]int{}}
	for i := range chaosLocalHosts {
		a.keys = append(a.keys, fmt.Sprintf("local/n%d", i))
	}
	for i := range chaosRoleHosts {
		a.keys = append(a.keys, fmt.Sprintf("pgc/p%d", i+1))
	}
	ctx, cancel := context.WithTimeout(context.Background(), chaosAttackCall)
	a.copy, _ = a.rdb.HGetAll(ctx, copyKeyName).Result()
	a.copyLog, _ = a.rdb.ZRangeWithScores(ctx, copyLogKeyName, 0, -1).Result()
	cancel()
	r.attacker = a
	r.event("Redis attacker started")
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			t := time.NewTimer(chaosAttackMin + rand.N(chaosAttackMax-chaosAttackMin))
			select {
			case <-quit:
				t.Stop()
				return
			case <-t.C:
			}
			a.once()
		}
	})
	return func() {
		close(quit)
		wg.Wait()
		a.rdb.Close()
	}
}

// once makes one attack, drawn at random.
func (a *chaosAttacker) once() {
	key := a.keys[rand.N(len(a.keys))]
	switch rand.N(9) {
	case 0:
		v := []string{"100000000000000000", "9223372036854775807"}[rand.N(2)]
		a.write("1 status version far ahead", "HSET", defaultPrefix+"{"+key+"}:status", "v", v)
	case 1:
		a.write("2 registry lease without TTL", "SET", registryLeaseKey, "fakeholder")
	case 2:
		v := []string{"9223372036854775807", "99999999999"}[rand.N(2)]
		a.write("3 copy version far ahead", "HSET", copyKeyName, "v", v)
	case 3:
		a.headStorm()
	case 4:
		a.replay()
	case 5:
		a.fakeMembers()
	case 6:
		a.write("6 node lease without TTL", "SET", defaultPrefix+"{"+key+"}:lease", "fakeholder")
	case 7:
		a.garbage(key)
	case 8:
		a.otherFleet()
	}
}

// write runs one command and counts it under name.
func (a *chaosAttacker) write(name string, args ...any) {
	ctx, cancel := context.WithTimeout(context.Background(), chaosAttackCall)
	defer cancel()
	a.count(name, a.rdb.Do(ctx, args...).Err())
}

func (a *chaosAttacker) count(name string, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err != nil && err != redis.Nil {
		a.failed++
		return
	}
	a.counts[name]++
}

// headStorm overwrites the copy's head every chaosHeadEvery for
// chaosHeadStorm, alternately with the head first read and with garbage.
func (a *chaosAttacker) headStorm() {
	head := a.copy["head"]
	for i, end := 0, time.Now().Add(chaosHeadStorm); time.Now().Before(end); i++ {
		v := head
		if i%2 == 1 || v == "" {
			v = "garbage"
		}
		a.write("4 copy head overwritten", "HSET", copyKeyName, "head", v)
		time.Sleep(chaosHeadEvery)
	}
}

// replay writes the copy first read back whole, with its log, and
// publishes its version.
func (a *chaosAttacker) replay() {
	if a.copy["v"] == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), chaosAttackCall)
	defer cancel()
	_, err := a.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, copyKeyName, copyLogKeyName)
		p.HSet(ctx, copyKeyName, a.copy)
		if len(a.copyLog) > 0 {
			p.ZAdd(ctx, copyLogKeyName, a.copyLog...)
		}
		p.Publish(ctx, copyChannelName, a.copy["v"])
		return nil
	})
	a.count("5 old copy replayed", err)
}

// otherFleet writes what the follower of a second fleet writes when that
// fleet has the same zone (so the same prefix) on this Redis but another
// registry: a database of another name on the same PostgreSQL, or one of
// the same name on another PostgreSQL (another system identifier), whose
// clusters have the same names and other addresses. It takes the registry
// lease with a TTL, as when the fleet's own follower has just lost it.
// Once a run (chaosFleets), it then writes its registry's copy whole and
// publishes it, renews the lease and vouches for the copy a few times, and
// gives the lease up (its fleet stopped) or lets it lapse (its fleet
// froze): an instance that took that copy would answer addresses of no
// backend of the run's. The other times it gives the lease up within a
// renewal period without writing, as a follower that cannot reach its
// registry does (after longer: a lease held without a copy keeps the
// fleet from following its registry, as a frozen follower of its own
// does, which the checks' budget does not cover).
func (a *chaosAttacker) otherFleet() {
	b, err := lock.NewRegistryCopy(a.rdb, defaultPrefix, nil, chaosFleetLease, "")
	if err != nil {
		a.count("7 registry lease taken by another fleet", err)
		return
	}
	if a.fleets >= chaosFleets || !a.ours() {
		ctx, cancel := context.WithTimeout(context.Background(), chaosAttackCall)
		err := a.rdb.Set(ctx, registryLeaseKey, b.Token(), chaosFleetLease).Err()
		cancel()
		a.count("7 registry lease taken by another fleet", err)
		if err != nil {
			return
		}
		time.Sleep(rand.N(chaosFleetTick))
		ctx, cancel = context.WithTimeout(context.Background(), chaosAttackCall)
		a.count("7 another fleet's lease given up", b.Release(ctx))
		cancel()
		return
	}
	a.fleets++
	parts := strings.Split(a.registry, " ") // system identifier, database, zones
	kind := "7 copy of another database on this PostgreSQL"
	if rand.N(2) == 0 {
		parts[1] = "staging"
	} else {
		kind = "7 copy of this database on another PostgreSQL"
		sys, _ := strconv.ParseUint(parts[0], 10, 64)
		parts[0] = strconv.FormatUint(sys^(1+rand.Uint64N(1<<62)), 10)
	}
	ctx, cancel := context.WithTimeout(context.Background(), chaosAttackCall)
	err = a.rdb.Set(ctx, registryLeaseKey, b.Token(), chaosFleetLease).Err()
	cancel()
	a.count("7 registry lease taken by another fleet", err)
	if err != nil {
		return
	}
	// Its first load is written at once: the fleet is without a follower
	// no longer than when its own follower hands over.
	ctx, cancel = context.WithTimeout(context.Background(), 2*chaosAttackCall)
	defer cancel()
	now, err := a.rdb.Time(ctx).Result()
	if err != nil {
		a.count(kind, err)
		return
	}
	// As a new follower writes: whole, in a term that starts now, its
	// version Redis's clock in seconds or, when the copy stored is
	// further on, just above it.
	w := lock.CopyWrite{Fields: a.fields, Full: true, Version: now.Unix(), Term: now.UnixMicro(), Alive: now, Registry: strings.Join(parts, " ")}
	res, err := b.Write(ctx, &lock.CopyState{}, w, chaosFleetLease)
	if err == nil && res.Result == lock.CopyDiverged {
		w.Version = max(w.Version, res.Stored+1)
		res, err = b.Write(ctx, &lock.CopyState{}, w, chaosFleetLease)
	}
	if err == nil && res.Result != lock.CopyWritten {
		// The lease or the copy went meanwhile: Redis was restarted.
		err = fmt.Errorf("the second fleet's write: result %d", res.Result)
	}
	a.count(kind, err)
	if err != nil {
		return
	}
	st := res.State
	for range 1 + rand.N(chaosFleetRenewals) {
		time.Sleep(chaosFleetTick)
		rctx, rcancel := context.WithTimeout(context.Background(), chaosAttackCall)
		rn, err := b.Renew(rctx, st, now, chaosFleetLease)
		rcancel()
		a.count("7 another fleet's lease renewed", err)
		if err != nil || !rn.Held {
			return
		}
		now = rn.Now
	}
	if rand.N(2) == 0 {
		rctx, rcancel := context.WithTimeout(context.Background(), chaosAttackCall)
		a.count("7 another fleet's lease given up", b.Release(rctx))
		rcancel()
	}
}

// ours reports whether the attacker knows the fleet's registry and its
// copy's fields, reading the copy again while it does not: the copy first
// read may be none yet, or one another attack wrote over.
func (a *chaosAttacker) ours() bool {
	if a.registry != "" || a.learn(a.copy) {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), chaosAttackCall)
	defer cancel()
	c, err := a.rdb.HGetAll(ctx, copyKeyName).Result()
	return err == nil && a.learn(c)
}

// learn takes the fleet's registry and the second fleet's fields from c, a
// copy of the fleet's, and reports whether it could.
func (a *chaosAttacker) learn(c map[string]string) bool {
	// Unsigned: the run's fleet has no redis_secret.
	var h lock.CopyHead
	if json.Unmarshal([]byte(c["head"]), &h) != nil || strings.Count(h.Registry, " ") != 2 || strings.HasPrefix(h.Registry, "0 ") {
		return false
	}
	// The second fleet's clusters have the fleet's names, on other
	// addresses: 127.0.1.x for the run's 127.0.0.x.
	var moves []string
	for _, host := range append(slices.Clone(chaosLocalHosts), chaosRoleHosts[:]...) {
		moves = append(moves, `"`+host+`"`, `"`+strings.Replace(host, "127.0.0.", "127.0.1.", 1)+`"`)
	}
	moved := strings.NewReplacer(moves...)
	fields := map[string][]byte{}
	for name, v := range c {
		if f, ok := strings.CutPrefix(name, "f:"); ok {
			fields[f] = []byte(moved.Replace(v))
		}
	}
	if len(fields) == 0 {
		return false
	}
	a.registry, a.fields = h.Registry, fields
	return true
}

// fakeMembers adds 50 members that do not exist, lapsing in ten years.
func (a *chaosAttacker) fakeMembers() {
	ctx, cancel := context.WithTimeout(context.Background(), chaosAttackCall)
	defer cancel()
	now, err := a.rdb.Time(ctx).Result()
	if err != nil {
		a.count("6 fake members", err)
		return
	}
	until := float64(now.Add(10 * 365 * 24 * time.Hour).UnixMilli())
	zs := make([]redis.Z, 50)
	for i := range zs {
		zs[i] = redis.Z{Score: until, Member: fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())}
	}
	a.count("6 fake members", a.rdb.ZAdd(ctx, membersKeyName, zs...).Err())
}

// garbage publishes, as one burst, chaosGarbage messages on the statuses channel that
// are not statuses, and now and then one of chaosHuge bytes.
func (a *chaosAttacker) garbage(key string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*chaosAttackCall)
	defer cancel()
	v := time.Now().UnixMicro()
	_, err := a.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range chaosGarbage {
			msg := "garbage " + strconv.Itoa(i)
			if i%2 == 1 {
				msg = statusMessage(v+int64(i), key, []byte("not a status"))
			}
			p.Publish(ctx, statusesChannel, msg)
		}
		if rand.N(chaosHugeOdds) == 0 {
			p.Publish(ctx, statusesChannel, statusMessage(v+chaosGarbage, key, []byte(strings.Repeat("x", chaosHuge))))
		}
		return nil
	})
	a.count("8 garbage bursts", err)
}

// summary is the attacker's line of the report.
func (a *chaosAttacker) summary() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var parts []string
	total := 0
	for _, name := range slices.Sorted(maps.Keys(a.counts)) {
		parts = append(parts, fmt.Sprintf("%s ×%d", name, a.counts[name]))
		total += a.counts[name]
	}
	return fmt.Sprintf("%d writes (%s); %d refused by a Redis stopped or frozen", total, strings.Join(parts, ", "), a.failed)
}
