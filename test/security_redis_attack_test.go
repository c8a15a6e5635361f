package test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"
	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// Keys an attacker writes, under the rig's default prefix (README,
// redis_prefix).
var (
	registryLeaseKey = defaultPrefix + "{registry}:lease"
	copyKeyName      = defaultPrefix + "{registry}:copy"
	copyLogKeyName   = defaultPrefix + "{registry}:log"
	copyChannelName  = defaultPrefix + "registry"
	membersKeyName   = defaultPrefix + "members"
	statusesChannel  = defaultPrefix + "statuses"
)

func nodeLeaseKey(node string) string { return defaultPrefix + "{local/" + node + "}:lease" }

// TestSecurityRedis is what someone who can write to the fleet's Redis,
// but has not its redis_secret, can do to four bin/coredns with check tcp
// (interval 500ms, timeout 200ms, fall 2: a stopped backend leaves every
// answer within fall × interval + timeout + lease = 2.9 s), each attack
// with the exact writes that once kept a dead or unhealthy node in the
// answers. In each, the stopped backend or unhealthy node leaves every
// instance's answers within the bound, an instance started under the
// attack never answers it, pgclusterctl status says what the instances
// answer, and no instance logs more than one line of a kind per minute.
func TestSecurityRedis(t *testing.T) {
	r := newRedisRig(t)
	r.attack("1_status_version_far_ahead", attackStatusVersion)
	r.attack("2_registry_lease_without_TTL", attackRegistryLease)
	r.attack("3_copy_version_far_ahead", attackCopyVersion)
	r.attack("4_copy_head_overwritten", attackCopyHead)
	r.attack("5_old_signed_copy_replayed", attackCopyReplay)
	r.attack("6_fake_members_and_lease_without_TTL", attackMembers)
	r.attack("7_two_fleets_one_prefix", attackTwoFleets)
	r.attack("8_garbage_and_huge_messages", attackGarbage)
	r.attack("9_old_status_replayed", attackOldStatus(false))
	r.attack("9_old_status_with_new_version", attackOldStatus(true))
}

// Attack 1: a status's version set far ahead, where Lua's old+1 no longer
// moves (past 2^53) and any version looks newer than the real ones: first
// a round number, then the largest int64.
func attackStatusVersion(t *testing.T, a *attackRun) {
	a.do("HSET", statusKeyOf("n1"), "v", "100000000000000000")
	a.stop(1)
	a.do("HSET", statusKeyOf("n2"), "v", "9223372036854775807")
	a.stop(2)
	a.newcomer(1, 2)
}

// Attack 2: the registry lease taken by nobody, for good (SET without a
// TTL): the fleet must follow the registry again.
func attackRegistryLease(t *testing.T, a *attackRun) {
	a.do("SET", registryLeaseKey, "fakeholder")
	a.unhealthy(2)
	a.repaired(registryLeaseKey)
	a.newcomer(2)
}

// Attack 3: the registry copy's version set far ahead: to the largest
// int64 (every follower's write over it fails), and to 99999999999, which
// as a SOA serial (mod 2^32) is below the one served. The changes still
// reach every answer, the serial never goes backwards, an instance
// started meanwhile answers, and the fleet keeps its registry sessions.
func attackCopyVersion(t *testing.T, a *attackRun) {
	serials := watchSerials(t, a.rig.ins)
	sessions := watchSessions(t, a.rig.pg.DSN(""))
	a.do("HSET", copyKeyName, "v", "99999999999")
	a.unhealthy(1)
	a.do("HSET", copyKeyName, "v", "9223372036854775807")
	a.unhealthy(3)
	a.newcomer(1, 3)
	for _, e := range serials() {
		t.Error(e)
	}
	// A copy refused is read from the registry itself until the follower
	// writes it again: each instance may open a session, once.
	pids := sessions()
	t.Logf("registry sessions of the fleet during the attack: %d distinct", pids)
	if most := 2 * (attackInstances + 1); pids > most {
		t.Errorf("the fleet opened %d registry sessions during the attack, more than %d: sessions churn", pids, most)
	}
}

// Attack 4: the copy's head overwritten every 5 ms, alternately with the
// genuine head of an earlier version and with garbage.
func attackCopyHead(t *testing.T, a *attackRun) {
	head, err := a.rig.rdb.HGet(a.ctx(), copyKeyName, "head").Result()
	if err != nil {
		t.Fatalf("the copy's head: %v", err)
	}
	a.repeat(5*time.Millisecond, func(ctx context.Context, i int) {
		v := head
		if i%2 == 1 {
			v = "garbage"
		}
		a.rig.rdb.HSet(ctx, copyKeyName, "head", v)
	})
	a.unhealthy(1)
	a.newcomer(1)
}

// Attack 5: an old copy, genuinely signed, replayed whole (with its log,
// and published) every 20 ms after a node was marked unhealthy: the
// running instances keep it out, and so does one started meanwhile.
func attackCopyReplay(t *testing.T, a *attackRun) {
	ctx := a.ctx()
	old, err := a.rig.rdb.HGetAll(ctx, copyKeyName).Result()
	if err != nil || old["v"] == "" {
		t.Fatalf("the copy: %v %v", old, err)
	}
	oldLog, err := a.rig.rdb.ZRangeWithScores(ctx, copyLogKeyName, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	a.unhealthy(0)
	a.repeat(20*time.Millisecond, func(ctx context.Context, _ int) {
		a.rig.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, copyKeyName, copyLogKeyName)
			p.HSet(ctx, copyKeyName, old)
			if len(oldLog) > 0 {
				p.ZAdd(ctx, copyLogKeyName, oldLog...)
			}
			p.Publish(ctx, copyChannelName, old["v"])
			return nil
		})
	})
	holdsFor(t, 2*time.Second, "while an old copy is replayed", answersExactly(a.rig.ins, hostsBut(0)))
	a.newcomer(0)
}

// Attack 6: fifty members that do not exist, their membership lapsing in
// ten years; then a node's lease taken by nobody, for good.
func attackMembers(t *testing.T, a *attackRun) {
	fakes := a.fakeMembers(50)
	a.stop(3)
	a.noFakeMembers(fakes)
	a.do("SET", nodeLeaseKey("n2"), "fakeholder")
	a.stop(2)
	a.repaired(nodeLeaseKey("n2"))
	a.newcomer(2, 3)
}

// Attack 8: 9,800 garbage messages on the statuses channel while a
// backend stops: each counted (rejected, or stale when its version is not
// above its key's last one), none costing a log line beyond one of its
// kind; then three messages of 5 MB: the instances' memory stays bounded.
func attackGarbage(t *testing.T, a *attackRun) {
	const garbage, huge = 9800, 5 << 20
	ins := a.rig.ins
	// A message whose version is not above its key's last one is dropped
	// as stale before it is read further; any other is refused.
	dropped := func(in *Instance) float64 { return metric(t, in, rejectedMetric) + metric(t, in, staleMetric) }
	before := make([]float64, len(ins))
	for i, in := range ins {
		before[i] = dropped(in)
	}
	var wg sync.WaitGroup
	var floodErr error
	wg.Go(func() {
		ctx := context.Background()
		v := time.Now().UnixMicro()
		for sent := 0; sent < garbage; {
			_, err := a.rig.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for range 200 {
					var msg string
					switch sent % 5 {
					case 0:
						msg = "garbage " + strconv.Itoa(sent)
					case 1:
						msg = fmt.Sprintf("%d 999 local/n0", v+int64(sent))
					case 2:
						msg = statusMessage(v+int64(sent), "local/n0", []byte("not a status"))
					case 3:
						msg = statusMessage(v+int64(sent), "local/n0", []byte(`{"addr":"127.0.0.81:1","holder":"x","at":1,"state":"down"}`))
					case 4:
						msg = "-1 0 "
					}
					p.Publish(ctx, statusesChannel, msg)
					sent++
				}
				return nil
			})
			if err != nil {
				floodErr = err
				return
			}
		}
	})
	a.stop(0)
	wg.Wait()
	if floodErr != nil {
		t.Fatalf("publishing garbage: %v", floodErr)
	}
	Eventually(t, 30*time.Second, func() error {
		for i, in := range ins {
			if got := dropped(in) - before[i]; got < garbage {
				return fmt.Errorf("%s counted %v of %d garbage messages rejected or stale", in.Addr(), got, garbage)
			}
		}
		return nil
	})
	for i, in := range ins {
		t.Logf("%s: %v messages counted rejected or stale during the flood of %d", in.Addr(), dropped(in)-before[i], garbage)
	}

	// Three messages of 5 MB: a status of 5 MB, a message of 5 MB that is
	// not one, and a status whose key is 5 MB long.
	rss := make([]int, len(ins))
	for i, in := range ins {
		rss[i], _ = vmKB(in.Pid(), "VmRSS")
		before[i] = dropped(in)
	}
	big := make([]byte, huge)
	for i := range big {
		big[i] = 'x'
	}
	v := time.Now().UnixMicro()
	for _, msg := range []string{
		statusMessage(v, "local/n0", big),
		string(big),
		statusMessage(v+1, string(big), []byte("{}")),
	} {
		if err := a.rig.rdb.Publish(a.ctx(), statusesChannel, msg).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Each instance reads one at least; reading them may take it long
	// enough to resubscribe (its echo marker late), which loses the rest:
	// Pub/Sub delivers at most once.
	counted := func(least float64) func() error {
		return func() error {
			for i, in := range ins {
				if got := dropped(in) - before[i]; got < least {
					return fmt.Errorf("%s counted %v of the 3 messages of 5 MB rejected or stale", in.Addr(), got)
				}
			}
			return nil
		}
	}
	Eventually(t, 30*time.Second, counted(1))
	if err := pgtest.WaitFor(5*time.Second, counted(3)); err != nil {
		t.Log(err)
	}
	for i, in := range ins {
		after, err := vmKB(in.Pid(), "VmRSS")
		if err != nil {
			t.Fatal(err)
		}
		peak, _ := vmKB(in.Pid(), "VmHWM")
		t.Logf("%s: RSS %d MB before three messages of 5 MB, %d MB after (peak since its start %d MB)", in.Addr(), rss[i]>>10, after>>10, peak>>10)
		if grew := (after - rss[i]) >> 10; grew > attackRSSGrowth {
			t.Errorf("%s: RSS grew by %d MB with three messages of 5 MB, more than %d MB", in.Addr(), grew, attackRSSGrowth)
		}
	}
	Eventually(t, 5*time.Second, answersExactly(ins, hostsBut(0)))
	a.newcomer(0)
}

// attackRSSGrowth bounds, in MB, how much three messages of 5 MB may add
// to an instance's resident memory: each is read whole by the Redis client
// before it can be refused, and a -race build's memory costs more; what is
// refused must be dropped, not kept or copied around.
const attackRSSGrowth = 80

// Attack 9: a genuine signed "up" of a node, captured while it was up,
// stored again every 50 ms after its backend stopped, with forged members
// beside: as captured (its own version), or with a version by Redis's
// clock. Every instance keeps the node out; pgclusterctl never says it is
// in and lists no forged member; an instance started meanwhile never
// answers it.
func attackOldStatus(newVersion bool) func(t *testing.T, a *attackRun) {
	return func(t *testing.T, a *attackRun) {
		ctx := a.ctx()
		// The attack before was undone with a FLUSHALL: n1's holder, which
		// did not lose Redis, stores its status again when it finds its
		// lease gone (at the lease's next extension, or its next write),
		// not at once.
		var captured []any
		Eventually(t, 10*time.Second, func() error {
			var err error
			captured, err = a.rig.rdb.HMGet(ctx, statusKeyOf("n1"), "v", "s").Result()
			if err != nil || len(captured) != 2 || captured[0] == nil || captured[1] == nil {
				return fmt.Errorf("n1's status: %v %v", captured, err)
			}
			return nil
		})
		capturedAt := time.Now()
		a.stop(1)
		fakes := a.fakeMembers(5)
		a.repeat(50*time.Millisecond, func(ctx context.Context, _ int) {
			v := captured[0]
			if newVersion {
				now, err := a.rig.rdb.Time(ctx).Result()
				if err != nil {
					return
				}
				v = now.UnixMicro()
			}
			a.rig.rdb.HSet(ctx, statusKeyOf("n1"), "v", v, "s", captured[1])
		})
		// Older than the bound: a status no holder would still stand by.
		Eventually(t, 10*time.Second, func() error {
			if age := time.Since(capturedAt); age < attackBound+time.Second {
				return fmt.Errorf("the captured status is %v old", age)
			}
			return nil
		})
		holdsFor(t, time.Second, "while n1's old up status is stored again", answersExactly(a.rig.ins, hostsBut(1)))
		a.agrees()
		a.noFakeMembers(fakes)
		a.newcomer(1)
	}
}

// hostsBut is attackHosts without the nodes except.
func hostsBut(except ...int) []string {
	var out []string
	for i, h := range attackHosts {
		if !slices.Contains(except, i) {
			out = append(out, h)
		}
	}
	return out
}

// repaired waits until the lease at key, which the attacker set without
// a TTL, is held with a TTL by someone else: its rightful owner took it.
func (a *attackRun) repaired(key string) {
	a.t.Helper()
	start := time.Now()
	Eventually(a.t, attackBound+attackMargin, func() error {
		ctx := a.ctx()
		holder, err := a.rig.rdb.Get(ctx, key).Result()
		if err != nil && err != redis.Nil {
			return err
		}
		ttl, err := a.rig.rdb.PTTL(ctx, key).Result()
		if err != nil {
			return err
		}
		if holder == "fakeholder" || holder == "" || ttl <= 0 {
			return fmt.Errorf("%s holds %q with TTL %v", key, holder, ttl)
		}
		return nil
	})
	a.t.Logf("%s held with a TTL again %v after the attack's lease was noticed", key, time.Since(start).Round(time.Millisecond))
}

// fakeMembers adds n members that do not exist to the fleet's members,
// their membership lapsing in ten years, and returns their tokens.
func (a *attackRun) fakeMembers(n int) []string {
	a.t.Helper()
	now, err := a.rig.rdb.Time(a.ctx()).Result()
	if err != nil {
		a.t.Fatal(err)
	}
	until := float64(now.Add(10 * 365 * 24 * time.Hour).UnixMilli())
	var fakes []string
	var zs []redis.Z
	for range n {
		tok := coretest.RandomHex(16)
		fakes = append(fakes, tok)
		zs = append(zs, redis.Z{Score: until, Member: tok})
	}
	if err := a.rig.rdb.ZAdd(a.ctx(), membersKeyName, zs...).Err(); err != nil {
		a.t.Fatal(err)
	}
	return fakes
}

// noFakeMembers checks that pgclusterctl status lists none of fakes as a
// live instance of the fleet.
func (a *attackRun) noFakeMembers(fakes []string) {
	a.t.Helper()
	rep, err := a.rig.ctlStatus(a.t, a.rig.pg.DSN(""))
	if err != nil {
		a.t.Fatal(err)
	}
	if rep.Fleet == nil {
		a.t.Fatal("pgclusterctl status -redis reports no fleet")
	}
	var listed []string
	for _, m := range rep.Fleet.Members {
		if slices.Contains(fakes, m) {
			listed = append(listed, m)
		}
	}
	if len(listed) > 0 {
		a.t.Errorf("pgclusterctl status lists %d forged members as live instances (of %d members listed)", len(listed), len(rep.Fleet.Members))
	}
}

// watchSerials asks each instance for the SOA serial every 50 ms until
// the returned function is called (or the test ends), which returns each
// time a serial went backwards (RFC 1982: a serial "less" than one served
// before).
func watchSerials(t testing.TB, ins []*Instance) func() []string {
	var (
		mu   sync.Mutex
		errs []string
		wg   sync.WaitGroup
	)
	quit := make(chan struct{})
	for _, in := range ins {
		wg.Go(func() {
			var top uint32
			seen := false
			for {
				select {
				case <-quit:
					return
				case <-time.After(50 * time.Millisecond):
				}
				m, err := Exchange("udp", in.Addr(), Zone, dns.TypeSOA)
				if err != nil || len(m.Answer) == 0 {
					continue
				}
				soa, ok := m.Answer[0].(*dns.SOA)
				if !ok {
					continue
				}
				switch {
				case !seen:
					top, seen = soa.Serial, true
				case int32(soa.Serial-top) < 0:
					mu.Lock()
					if len(errs) < 5 {
						errs = append(errs, fmt.Sprintf("%s served SOA serial %d after %d: backwards", in.Addr(), soa.Serial, top))
					}
					mu.Unlock()
				default:
					top = soa.Serial
				}
			}
		})
	}
	stop := sync.OnceValue(func() []string {
		close(quit)
		wg.Wait()
		return errs
	})
	t.Cleanup(func() { stop() })
	return stop
}

// watchSessions samples the fleet's registry sessions every 100 ms until
// the returned function is called (or the test ends), which returns how
// many distinct ones it saw.
func watchSessions(t testing.TB, dsn string) func() int {
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	pids := map[int]bool{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			rows, err := conn.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = 'coredns-pgcluster'")
			if err == nil {
				for rows.Next() {
					var pid int
					if rows.Scan(&pid) == nil {
						pids[pid] = true
					}
				}
				rows.Close()
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
	stop := sync.OnceValue(func() int {
		cancel()
		wg.Wait()
		conn.Close(context.Background())
		return len(pids)
	})
	t.Cleanup(func() { stop() })
	return stop
}
