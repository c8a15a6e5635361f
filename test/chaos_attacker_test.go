package test

import (
	"context"
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
)

// chaosAttackerOn reports whether the chaos run has its Redis attacker:
// unless CHAOS_ATTACKER is 0.
func chaosAttackerOn() bool { return os.Getenv("CHAOS_ATTACKER") != "0" }

// chaosAttacker writes into the chaos fleet's Redis, at random, what
// someone who can write there might (the chaos fleet has no redis_secret,
// so what it vets is bounds, not signatures): the writes of TestSecurityRedis's
// attacks 1 to 6 and 8 (7 is a second fleet, not a write). Neither the
// answers nor the judge know of it: a write that moves an answer shows
// as a wrong answer.
type chaosAttacker struct {
	rdb  *redis.Client
	keys []string // the fleet's check keys, cluster/node
	// copy is the registry copy and its log as first read: what a replay
	// writes back.
	copy    map[string]string
	copyLog []redis.Z

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
	switch rand.N(8) {
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
