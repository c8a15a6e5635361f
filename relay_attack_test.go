package pgcluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
	"github.com/pgcluster/pgcluster/lock"
)

// What someone who can write to the fleet's Redis, but has not its
// redis_secret, can do to the registry relay: the writes that once kept a
// node the registry marks unhealthy in the answers, each against relays
// on a real PostgreSQL and redis-server, as pgcluster runs them (a relay,
// its publisher and its handler per instance, in this process). In each,
// the node leaves every instance's answers within the checks' bound of
// the attacks' fleet (fall × interval + timeout + lease = 2.9 s), and an
// instance started under the attack never answers it.

// relayAttackBound is the checks' bound of the attacks' fleet (check tcp,
// interval 500ms, timeout 200ms, fall 2, and the 2 s lease); asserted
// with relayAttackMargin for a loaded machine, the figures logged.
const (
	relayAttackBound  = 2900 * time.Millisecond
	relayAttackMargin = 2 * time.Second
	relayAttackSecret = "relay-attack-secret-0123456789"
)

// attackNodes are the registry's nodes: cluster local, pg1 to pg3.
var attackNodes = []string{"192.0.2.1", "192.0.2.2", "192.0.2.3"}

// relayRig is a registry, a redis-server, and the fleet's instances.
type relayRig struct {
	t      *testing.T
	pg     *pgtest.Postgres
	rs     *redistest.Server
	rdb    *redis.Client // the attacker's
	prefix string
	mu     sync.Mutex // over ins
	ins    []*relayInstance
}

// relayInstance is one instance: its relay and the handler it publishes to.
type relayInstance struct {
	name string
	p    *PgCluster
	r    *relay
}

func newRelayRig(t *testing.T) *relayRig {
	t.Helper()
	g := &relayRig{t: t, pg: pgtest.New(t), rs: redistest.Start(t), prefix: "attack:"}
	g.rdb = g.rs.Client(t)
	g.pg.MustExec(t, Schema)
	for i, a := range attackNodes {
		role := "standby"
		if i == 0 {
			role = "primary"
		}
		g.pg.MustExec(t, fmt.Sprintf("INSERT INTO pgcluster_nodes(cluster, name, address, role) VALUES ('local', 'pg%d', '%s', '%s')", i+1, a, role))
	}
	g.pg.MustExec(t, "INSERT INTO pgcluster_aliases VALUES ('prod', 'local')")
	return g
}

// settings are an instance's, on the registry at dsn with secret.
func (g *relayRig) settings(dsn, secret string) *settings {
	return &settings{zones: []string{testZone}, dsn: dsn, ttl: 5, refresh: time.Hour,
		redisURL: g.rs.URL(), redisPrefix: g.prefix, redisSecret: []byte(secret)}
}

// start starts an instance with set, stopped when the test ends.
func (g *relayRig) start(name string, set *settings) *relayInstance {
	g.t.Helper()
	p := &PgCluster{Zones: set.zones, ttl: set.ttl, Next: test.ErrorHandler()}
	r, err := newRelay(set, publisherFor(p, set), "")
	if err != nil {
		g.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go r.run(ctx)
	g.t.Cleanup(func() {
		cancel()
		<-r.done
	})
	return &relayInstance{name: name, p: p, r: r}
}

// fleet starts n instances of the rig's registry, and waits until each
// answers every node.
func (g *relayRig) fleet(n int) {
	g.t.Helper()
	for i := range n {
		g.add(g.start(fmt.Sprintf("instance %d", i+1), g.settings(g.pg.DSN(""), relayAttackSecret)))
	}
	g.wait(10*time.Second, "the fleet answers every node", func() error { return answersExactly(g.fleetNow(), attackNodes) })
	g.wait(10*time.Second, "one follower", func() error { return g.oneFollower() })
}

func (g *relayRig) add(in *relayInstance) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ins = append(g.ins, in)
}

// fleetNow is the fleet's instances now.
func (g *relayRig) fleetNow() []*relayInstance {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.ins)
}

// oneFollower checks that an instance holds the registry lease with a TTL.
func (g *relayRig) oneFollower() error {
	ctx := context.Background()
	holder, _ := g.rdb.Get(ctx, g.prefix+"{registry}:lease").Result()
	ttl, _ := g.rdb.PTTL(ctx, g.prefix+"{registry}:lease").Result()
	for _, in := range g.fleetNow() {
		if in.r.rc.Token() == holder && ttl > 0 {
			return nil
		}
	}
	return fmt.Errorf("the registry lease is held by %q, TTL %v: no instance of the fleet", holder, ttl)
}

func (g *relayRig) wait(d time.Duration, what string, cond func() error) {
	g.t.Helper()
	if err := pgtest.WaitFor(d, cond); err != nil {
		g.t.Fatalf("%s: not within %v: %v", what, d, err)
	}
}

// answer asks p for local.<zone> A: its rcode and addresses (rcode -1:
// nothing loaded yet, no answer).
func answer(p *PgCluster) (int, []string) {
	m := new(dns.Msg)
	m.SetQuestion("local."+testZone, dns.TypeA)
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	p.ServeDNS(context.Background(), rec, m)
	if rec.Msg == nil {
		return -1, nil
	}
	return rec.Msg.Rcode, slices.Sorted(slices.Values(Addrs(rec.Msg)))
}

// answersExactly checks that every instance answers exactly addrs.
func answersExactly(ins []*relayInstance, addrs []string) error {
	want := slices.Sorted(slices.Values(addrs))
	for _, in := range ins {
		if rc, got := answer(in.p); rc != dns.RcodeSuccess || !slices.Equal(got, want) {
			return fmt.Errorf("%s answers %s %v, want %v", in.name, dns.RcodeToString[rc], got, want)
		}
	}
	return nil
}

// unhealthy marks node i unhealthy in the registry and returns how long
// until no instance answers it (failing the test past the bound).
func (g *relayRig) unhealthy(i int, serving []string) time.Duration {
	g.t.Helper()
	start := time.Now()
	g.pg.MustExec(g.t, fmt.Sprintf("UPDATE pgcluster_nodes SET healthy = false WHERE address = '%s'", attackNodes[i]))
	left := slices.DeleteFunc(slices.Clone(serving), func(a string) bool { return a == attackNodes[i] })
	g.wait(relayAttackBound+relayAttackMargin, fmt.Sprintf("pg%d leaves every answer", i+1), func() error { return answersExactly(g.fleetNow(), left) })
	took := time.Since(start)
	if took > relayAttackBound {
		g.t.Logf("pg%d left every answer after %v: beyond the bound of %v (within the margin for a loaded machine)", i+1, took.Round(time.Millisecond), relayAttackBound)
	}
	return took
}

// newcomer starts an instance under the attack and checks, every 5 ms
// for 3 s, that it never answers an address of never, and answers within
// the bound; it returns how long it took to answer.
func (g *relayRig) newcomer(never []string) time.Duration {
	g.t.Helper()
	start := time.Now()
	in := g.start("the newcomer", g.settings(g.pg.DSN(""), relayAttackSecret))
	var first time.Duration
	for time.Since(start) < 3*time.Second || first == 0 {
		if time.Since(start) > relayAttackBound+relayAttackMargin && first == 0 {
			g.t.Fatalf("the newcomer answers nothing %v after its start", time.Since(start).Round(time.Millisecond))
		}
		rc, got := answer(in.p)
		if rc == dns.RcodeSuccess && first == 0 {
			first = time.Since(start)
		}
		if rc != -1 && rc != dns.RcodeSuccess {
			g.t.Errorf("the newcomer answered %s %v after its start", dns.RcodeToString[rc], time.Since(start).Round(time.Millisecond))
		}
		for _, a := range got {
			if slices.Contains(never, a) {
				g.t.Fatalf("the newcomer answered %s, which the registry marks unhealthy, %v after its start", a, time.Since(start).Round(time.Millisecond))
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	g.add(in)
	return first
}

// replayCopy stores a saved registry copy and its log again, and
// publishes its version, as fast as Redis takes it until the returned
// function is called: an old copy, genuinely signed, replayed whole.
func (g *relayRig) replayCopy(t *testing.T, stored map[string]string, log []redis.Z) func() {
	ctx := context.Background()
	key, logKey := g.prefix+"{registry}:copy", g.prefix+"{registry}:log"
	return repeat(t, 0, func(int) {
		g.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, key, logKey)
			p.HSet(ctx, key, stored)
			p.ZAdd(ctx, logKey, log...)
			p.Publish(ctx, g.prefix+"registry", stored["v"])
			return nil
		})
	})
}

// repeat runs f every d (0: again as soon as it returns) until the
// returned function is called (or the test ends).
func repeat(t *testing.T, d time.Duration, f func(i int)) func() {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			f(i)
			select {
			case <-quit:
				return
			case <-time.After(d):
			}
		}
	})
	stop := sync.OnceFunc(func() {
		close(quit)
		wg.Wait()
	})
	t.Cleanup(stop)
	return stop
}

// watchSerial asks every instance for the SOA serial every 20 ms, and
// returns a function that stops and reports each time a serial went
// backwards (RFC 1982).
func (g *relayRig) watchSerial() func() []string {
	var mu sync.Mutex
	var bad []string
	top := map[string]uint32{}
	stop := repeat(g.t, 20*time.Millisecond, func(int) {
		for _, in := range g.fleetNow() {
			s := in.p.snapshot()
			if s == nil {
				continue
			}
			mu.Lock()
			if last, ok := top[in.name]; ok && serialAfter(last, s.serial) {
				bad = append(bad, fmt.Sprintf("%s served serial %d after %d", in.name, s.serial, last))
			}
			if last, ok := top[in.name]; !ok || serialAfter(s.serial, last) {
				top[in.name] = s.serial
			}
			mu.Unlock()
		}
	})
	return func() []string {
		stop()
		mu.Lock()
		defer mu.Unlock()
		return bad
	}
}

// rejectedReads is relay_reads_total{result="rejected"} of the tests'
// zone, summed over the instances of this process.
func rejectedReads() float64 {
	var m dto.Metric
	if err := relayReads.WithLabelValues(testZone, "rejected").Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// linesOfKind counts the lines of log that hold what.
func linesOfKind(log, what string) int { return strings.Count(log, what) }

// Attack 2: the registry lease set with no TTL, by nobody (SET
// fakeholder): the next instance that may take it does, the fleet follows
// the registry again, and a change reaches every answer within the bound.
func TestRelayAttackLeaseWithoutTTL(t *testing.T) {
	g := newRelayRig(t)
	g.fleet(2)
	ctx := context.Background()
	g.rdb.Set(ctx, g.prefix+"{registry}:lease", "fakeholder", 0)
	took := g.unhealthy(1, attackNodes)
	start := time.Now()
	g.wait(relayAttackBound+relayAttackMargin, "the registry lease held again by the fleet", g.oneFollower)
	t.Logf("lease without TTL: pg2 left every answer %v after it was marked unhealthy; the lease was the fleet's again %v later",
		took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	first := g.newcomer([]string{attackNodes[1]})
	t.Logf("lease without TTL: an instance started after answered in %v, never pg2", first.Round(time.Millisecond))
}

// Attack 3: the copy's version set far ahead of Redis's clock, to the
// largest int64 (no write above it is possible) and to 99999999999 (as a
// SOA serial, mod 2^32, below today's): a reader refuses the copy, the
// follower writes its own over it, changes reach every answer within the
// bound, the SOA serial never goes backwards, and a new instance answers.
func TestRelayAttackCopyVersionAhead(t *testing.T) {
	g := newRelayRig(t)
	g.fleet(3)
	serials := g.watchSerial()
	ctx := context.Background()
	serving := attackNodes
	for i, v := range []string{"9223372036854775807", "99999999999"} {
		g.rdb.HSet(ctx, g.prefix+"{registry}:copy", "v", v)
		took := g.unhealthy(i, serving)
		serving = slices.Delete(slices.Clone(serving), 0, 1)
		t.Logf("copy version %s: pg%d left every answer %v after it was marked unhealthy", v, i+1, took.Round(time.Millisecond))
	}
	first := g.newcomer(attackNodes[:2])
	t.Logf("copy version ahead: an instance started after answered in %v, never pg1 or pg2", first.Round(time.Millisecond))
	g.rdb.HSet(ctx, g.prefix+"{registry}:copy", "v", "99999999999")
	g.wait(5*time.Second, "the follower wrote its copy over the forged version", func() error {
		v, err := g.rdb.HGet(ctx, g.prefix+"{registry}:copy", "v").Int64()
		if err != nil || v == 99999999999 || v > time.Now().Unix()+60 {
			return fmt.Errorf("the copy's version is %d (%v)", v, err)
		}
		return nil
	})
	for _, e := range serials() {
		t.Error(e)
	}
	for _, in := range g.fleetNow() {
		if s := in.p.snapshot().serial; int64(s) > time.Now().Unix()+60 || int64(s) < time.Now().Unix()-3600 {
			t.Errorf("%s serves serial %d, not the fleet's version by Redis's clock", in.name, s)
		}
	}
}

// Attack 4: the copy's head overwritten as fast as Redis takes it
// (the attack once used 5 ms), alternately with the genuine head of an
// earlier version and with garbage, so that a reader seldom reads the
// follower's head in the moment before it is overwritten: a reader that
// cannot vet the copy follows PostgreSQL itself within relayDistrust, so
// a change reaches every answer within the bound, and a new instance
// never answers the node the registry marked unhealthy.
func TestRelayAttackCopyHeadOverwritten(t *testing.T) {
	g := newRelayRig(t)
	g.fleet(3)
	ctx := context.Background()
	old, err := g.rdb.HGet(ctx, g.prefix+"{registry}:copy", "head").Result()
	if err != nil {
		t.Fatal(err)
	}
	stop := repeat(t, 0, func(i int) {
		h := old
		if i%2 == 1 {
			h = "garbage"
		}
		g.rdb.HSet(ctx, g.prefix+"{registry}:copy", "head", h)
	})
	took := g.unhealthy(0, attackNodes)
	t.Logf("head overwritten without pause: pg1 left every answer %v after it was marked unhealthy", took.Round(time.Millisecond))
	first := g.newcomer(attackNodes[:1])
	t.Logf("head overwritten without pause: an instance started meanwhile answered in %v, never pg1", first.Round(time.Millisecond))
	took = g.unhealthy(1, attackNodes[1:])
	t.Logf("head overwritten without pause: pg2 left every answer (the newcomer's too) %v after it was marked unhealthy", took.Round(time.Millisecond))
	stop()
}

// Attack 5: an old copy, genuinely signed, replayed whole (its log too,
// and published) as fast as Redis takes it (the attack once used 20 ms)
// after a node was marked unhealthy: the running instances never answer
// the node again, a change still reaches every answer within the bound,
// and a new instance, which refuses a copy the follower has not vouched
// for within a lease, never answers the node either.
func TestRelayAttackCopyReplayed(t *testing.T) {
	g := newRelayRig(t)
	g.fleet(3)
	ctx := context.Background()
	key, logKey := g.prefix+"{registry}:copy", g.prefix+"{registry}:log"
	saved, err := g.rdb.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	savedLog, err := g.rdb.ZRangeWithScores(ctx, logKey, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Older than a lease, as an old copy is.
	time.Sleep(relayLease + relayTick)
	took := g.unhealthy(0, attackNodes)
	t.Logf("before the replay: pg1 left every answer %v after it was marked unhealthy", took.Round(time.Millisecond))
	stop := g.replayCopy(t, saved, savedLog)
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if err := answersExactly(g.fleetNow(), attackNodes[1:]); err != nil {
			t.Fatalf("while an old copy is replayed: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	first := g.newcomer(attackNodes[:1])
	t.Logf("old copy replayed without pause: no instance answered pg1 for 2 s; one started meanwhile answered in %v, never pg1", first.Round(time.Millisecond))
	took = g.unhealthy(1, attackNodes[1:])
	t.Logf("old copy replayed without pause: pg2 left every answer %v after it was marked unhealthy", took.Round(time.Millisecond))
	stop()
}

// Garbage on the copy's channel (9,800 messages, and three of 5 MB) is
// counted rejected, read no further, and logged once; a version ahead of
// Redis's clock published is not read for; the channel is heard after.
// (Redis may drop a subscriber whose buffer the 5 MB messages fill: then
// they are not even received, and the subscription is made again.)
func TestRelayAttackGarbageNews(t *testing.T) {
	logs := captureLog(t)
	g := newRelayRig(t)
	g.fleet(2)
	ctx := context.Background()
	before := rejectedReads()
	ch := g.prefix + "registry"
	pipe := g.rdb.Pipeline()
	for i := range 9800 {
		pipe.Publish(ctx, ch, fmt.Sprintf("garbage %d", i))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("9", 5<<20)
	for range 3 {
		g.rdb.Publish(ctx, ch, huge)
	}
	g.rdb.Publish(ctx, ch, "99999999999")
	want := before + 2*9800 // each of the 2 instances
	g.wait(10*time.Second, "every garbage message counted", func() error {
		if n := rejectedReads(); n < want {
			return fmt.Errorf("relay_reads_total{result=rejected} %v, want %v", n, want)
		}
		return nil
	})
	took := g.unhealthy(2, attackNodes)
	t.Logf("garbage news: %v rejected; a change then left every answer in %v", rejectedReads()-before, took.Round(time.Millisecond))
	out := logs.String()
	if n := linesOfKind(out, "is not a positive number"); n > 2 {
		t.Errorf("%d log lines about garbage messages from 2 instances, want at most one each", n)
	}
	if strings.Contains(out, strings.Repeat("9", 100)) {
		t.Error("a log line carries the 5 MB message")
	}
}

// Attack 7: two fleets with the same zone, so the same prefix, on one
// Redis, each on a registry of its own (fleet B's is database staging of
// the same server, where prod → staging): with the same secret, and then
// with another, whichever holds the registry lease, each fleet answers
// its own registry, a change in fleet A's reaches its answers within the
// bound, and the shared prefix is logged.
func TestRelayAttackTwoFleets(t *testing.T) {
	logs := captureLog(t)
	g := newRelayRig(t)
	g.fleet(2)
	ctx := context.Background()
	g.pg.MustExec(t, "CREATE DATABASE staging")
	conn, err := pgx.Connect(ctx, g.pg.DSN("staging"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, Schema+"; INSERT INTO pgcluster_nodes(cluster, name, address, role) VALUES ('local', 's0', '192.0.2.91', 'primary')"); err != nil {
		t.Fatal(err)
	}
	serving := attackNodes
	for i, secret := range []string{relayAttackSecret, "another-secret-0123456789abcdef"} {
		b := g.start(fmt.Sprintf("fleet B (%d)", i+1), g.settings(g.pg.DSN("staging"), secret))
		start := time.Now()
		// Fleet B takes the lease, as when fleet A's follower restarts.
		g.wait(10*time.Second, "fleet B follows", func() error {
			if h, _ := g.rdb.Get(ctx, g.prefix+"{registry}:lease").Result(); h != b.r.rc.Token() {
				g.rdb.Del(ctx, g.prefix+"{registry}:lease")
				return fmt.Errorf("the lease is %q", short(h))
			}
			return nil
		})
		g.wait(relayAttackBound+relayAttackMargin, "each fleet its registry", func() error {
			if err := answersExactly(g.fleetNow(), serving); err != nil {
				return fmt.Errorf("fleet A: %w", err)
			}
			return answersExactly([]*relayInstance{b}, []string{"192.0.2.91"})
		})
		settled := time.Since(start)
		deadline := time.Now().Add(2 * time.Second)
		for time.Now().Before(deadline) {
			if err := answersExactly(g.fleetNow(), serving); err != nil {
				t.Fatalf("fleet A, while fleet B follows: %v", err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		took := g.unhealthy(i, serving)
		serving = slices.Delete(slices.Clone(serving), 0, 1)
		t.Logf("two fleets, secret %d: each answered its own registry %v after fleet B took the lease; a change in fleet A's left its answers in %v",
			i+1, settled.Round(time.Millisecond), took.Round(time.Millisecond))
		if err := answersExactly([]*relayInstance{b}, []string{"192.0.2.91"}); err != nil {
			t.Errorf("fleet B: %v", err)
		}
		g.wait(5*time.Second, "the shared prefix logged", func() error {
			if !strings.Contains(logs.String(), "shares the Redis prefix") && !strings.Contains(logs.String(), "another fleet shares the prefix") {
				return fmt.Errorf("no line says that another fleet shares the prefix")
			}
			return nil
		})
	}
	if n := linesOfKind(logs.String(), "another fleet shares the Redis prefix"); n > 3 {
		t.Errorf("%d lines about the shared prefix from 3 instances, want at most one each a minute", n)
	}
}

// registryUpNow is registry_up of the tests' zone.
func registryUpNow() float64 {
	var m dto.Metric
	if err := registryUp.WithLabelValues(testZone).Write(&m); err != nil {
		return -1
	}
	return m.GetGauge().GetValue()
}

// registry_up says whether the answers follow the registry: 1 for a
// reader whose follower vouches for the copy it applied; 0 once the copy
// is refused (here its version set ahead of Redis's clock) while
// PostgreSQL is gone too, so that nothing fresh is served, however long
// that lasts; the last snapshot is still answered, never SERVFAIL. The
// test is the follower, through the lock API, and does not repair the
// copy.
func TestRelayRegistryUpWhenRefused(t *testing.T) {
	g := newRelayRig(t)
	ctx := context.Background()
	set := g.settings(g.pg.DSN(""), relayAttackSecret)
	var ns []Node
	for i, a := range attackNodes {
		ns = append(ns, node("local", fmt.Sprintf("pg%d", i+1), a, "standby"))
	}
	stop := g.follow(g.identity(set), ns)
	defer stop()
	rdb := g.rs.Client(t)

	r := g.start("the reader", set)
	g.add(r)
	g.wait(10*time.Second, "the reader answers the copy, registry_up 1", func() error {
		if err := answersExactly([]*relayInstance{r}, attackNodes); err != nil {
			return err
		}
		if up := registryUpNow(); up != 1 {
			return fmt.Errorf("registry_up %v", up)
		}
		return nil
	})
	if err := g.pg.Stop(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rdb.HSet(ctx, g.prefix+"{registry}:copy", "v", "99999999999")
	g.wait(relayAttackBound+relayAttackMargin, "registry_up 0", func() error {
		if up := registryUpNow(); up != 0 {
			return fmt.Errorf("registry_up %v", up)
		}
		return nil
	})
	t.Logf("copy refused, PostgreSQL stopped: registry_up 0 after %v", time.Since(start).Round(time.Millisecond))
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if up := registryUpNow(); up != 0 {
			t.Fatalf("registry_up %v %v after the copy was refused, with PostgreSQL stopped", up, time.Since(start).Round(time.Millisecond))
		}
		if err := answersExactly([]*relayInstance{r}, attackNodes); err != nil {
			t.Fatalf("the last snapshot: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// An old copy, genuinely signed and vouched for after the readers went to
// follow PostgreSQL themselves (the copy's head overwritten with garbage),
// but before a change they read there, replayed whole when their hold
// ends: no reader goes back to it, so none answers the node the change
// took out; once the replay stops they read the copy again.
func TestRelayAttackReplayAtRejoin(t *testing.T) {
	g := newRelayRig(t)
	g.fleet(3)
	ctx := context.Background()
	key, logKey := g.prefix+"{registry}:copy", g.prefix+"{registry}:log"
	sessions := func() int {
		var n int
		if err := g.pg.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'coredns-pgcluster'", &n); err != nil {
			return -1
		}
		return n
	}
	garbage := repeat(t, 0, func(int) { g.rdb.HSet(ctx, key, "head", "garbage") })
	g.wait(20*time.Second, "every instance follows PostgreSQL", func() error {
		if n := sessions(); n != 3 {
			return fmt.Errorf("%d registry sessions", n)
		}
		return nil
	})
	local := time.Now()
	garbage()
	// The follower writes the copy again, and vouches for it.
	var saved map[string]string
	g.wait(10*time.Second, "a genuine copy", func() error {
		var err error
		saved, err = g.rdb.HGetAll(ctx, key).Result()
		if err != nil || saved["head"] == "garbage" || saved["v"] == "" {
			return fmt.Errorf("head %.20q, %v", saved["head"], err)
		}
		return nil
	})
	// Vouched for since the readers went local, and still fresh (within
	// a lease) when their hold ends: the change comes after.
	time.Sleep(time.Until(local.Add(relayHold - relayLease/2)))
	saved, err := g.rdb.HGetAll(ctx, key).Result()
	if err != nil || saved["head"] == "garbage" {
		t.Fatalf("the copy: head %.20q, %v", saved["head"], err)
	}
	savedLog, err := g.rdb.ZRangeWithScores(ctx, logKey, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	g.unhealthy(0, attackNodes)
	stop := g.replayCopy(t, saved, savedLog)
	for end := time.Now().Add(relayHold + 3*time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if err := answersExactly(g.fleetNow(), attackNodes[1:]); err != nil {
			t.Fatalf("while a copy older than the readers' own read is replayed: %v", err)
		}
	}
	stop()
	g.wait(relayHold+10*time.Second, "the readers read the copy again", func() error {
		if n := sessions(); n != 1 {
			return fmt.Errorf("%d registry sessions", n)
		}
		return answersExactly(g.fleetNow(), attackNodes[1:])
	})
}

// Another fleet's copy of a database of the same name on another
// PostgreSQL (another system identifier), under the same prefix and with
// the same secret, written and vouched for by its follower as an instance
// of this fleet starts: the instance never answers it, not even for the
// milliseconds before it has read its own registry's identifier, and
// follows its own registry instead.
func TestRelayForeignCopyAtStart(t *testing.T) {
	g := newRelayRig(t)
	set := g.settings(g.pg.DSN(""), relayAttackSecret)
	id := g.identity(set)
	id.sys ^= 0x5a5a5a5a // the same database name on another PostgreSQL
	foreign := "192.0.2.91"
	stop := g.follow(id, []Node{node("local", "pg1", foreign, "primary")})
	defer stop()

	for i := range 3 {
		in := g.start(fmt.Sprintf("instance %d", i+1), set)
		start := time.Now()
		for {
			rc, got := answer(in.p)
			if slices.Contains(got, foreign) {
				t.Fatalf("instance %d answered the other fleet's %s %v after its start", i+1, foreign, time.Since(start).Round(time.Millisecond))
			}
			if rc == dns.RcodeSuccess && answersExactly([]*relayInstance{in}, attackNodes) == nil {
				break
			}
			if time.Since(start) > relayAttackBound+relayAttackMargin {
				t.Fatalf("instance %d does not answer its own registry %v after its start (rcode %d, %v)", i+1, time.Since(start).Round(time.Millisecond), rc, got)
			}
			time.Sleep(time.Millisecond)
		}
		t.Logf("instance %d answered its own registry %v after its start", i+1, time.Since(start).Round(time.Millisecond))
	}
}

// identity is the registry set names, its system identifier read.
func (g *relayRig) identity(set *settings) registryID {
	g.t.Helper()
	id := configRegistryID(set)
	sys, err := readSystemID(context.Background(), set.dsn)
	if err != nil {
		g.t.Fatal(err)
	}
	id.sys = sys
	return id
}

// follow makes the test the follower of registry id, through the lock
// API: it takes the registry lease, writes a copy whose cluster local has
// nodes, whole and signed with relayAttackSecret, and renews the lease
// and vouches for the copy every relayTick until the returned function is
// called.
func (g *relayRig) follow(id registryID, nodes []Node) (stop func()) {
	t := g.t
	t.Helper()
	ctx := context.Background()
	fc, err := lock.NewRegistryCopy(g.rs.Client(t), g.prefix, []byte(relayAttackSecret), relayLease, "")
	if err != nil {
		t.Fatal(err)
	}
	p, err := fc.Poll(ctx, true, relayLease)
	if err != nil || !p.Taken {
		t.Fatalf("the test's follower takes the lease: %+v %v", p, err)
	}
	rows := &rowSet{}
	rows.merge(rowsUpdate{full: true, nodes: map[string][]Node{"local": nodes}, aliasesSet: true}, time.Now())
	res, err := fc.Write(ctx, &lock.CopyState{}, lock.CopyWrite{Fields: allFields(rows), Full: true, Version: p.Now.Unix(),
		Term: p.Now.UnixMicro(), Alive: p.Now, Registry: id.String()}, relayLease)
	if err != nil || res.Result != lock.CopyWritten {
		t.Fatalf("the test's follower writes the copy: %+v %v", res, err)
	}
	st := res.State
	return repeat(t, relayTick, func(int) {
		if rn, err := fc.Renew(ctx, st, time.Now(), relayLease); err != nil || !rn.Held {
			t.Errorf("the test's follower renews: %+v %v", rn, err)
		}
	})
}
