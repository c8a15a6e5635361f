package test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"
	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/proc"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// The relay's lease TTL (relay.go's relayLease): a follower that dies is
// replaced within it.
const relayLeaseTTL = 3 * time.Second

const (
	relayPrefix = "relaytest:"
	relaySecret = "relay-test-secret-0123456789abcdef"
	// relayName is the name every change moves.
	relayName = "local." + Zone
	// relayTestGrace is the fleet's relay_grace: how long a reader serves
	// its copy while Redis does not answer before it follows PostgreSQL.
	relayTestGrace = 2 * time.Second
)

// relayWorld is a registry, a redis-server, and the instances of a fleet
// that shares its registry through Redis (redis without check: the relay
// on by default).
type relayWorld struct {
	t        testing.TB
	pg       *pgtest.Postgres
	rs       *redistest.Server
	corefile string
	ins      []*Instance
	mu       sync.Mutex // over conn
	conn     *pgx.Conn  // makes the changes, counts the sessions
	last     int        // the address last written: 192.0.2.<last>
}

func newRelayWorld(t testing.TB, n int) *relayWorld {
	t.Helper()
	return newRelayWorldGrace(t, n, fmt.Sprintf("\n  relay_grace %v", relayTestGrace))
}

// newRelayWorldGrace is newRelayWorld with grace in the pgcluster block
// for its relay_grace line ("" for the default).
func newRelayWorldGrace(t testing.TB, n int, grace string) *relayWorld {
	t.Helper()
	w := &relayWorld{t: t, pg: Registry(t), rs: redistest.Start(t), last: 1}
	w.pg.MustExec(t, "INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES ('local', 'n0', '192.0.2.1', 5432, 'primary')")
	w.corefile = fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n prometheus 127.0.0.1:%s\n pgcluster {\n  postgres %s\n  redis %s\n  redis_prefix %s\n  redis_secret %s%s\n }\n}\n",
		Zone, PortPlaceholder, MetricsPlaceholder, w.pg.DSN(""), w.rs.URL(), relayPrefix, relaySecret, grace)
	w.connect()
	// Started together, as a fleet's hosts boot: each answers once loaded.
	w.ins = StartTogether(t, slices.Repeat([]string{w.corefile}, n)...)
	return w
}

func (w *relayWorld) connect() {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, w.pg.DSN("")+"&application_name=relaytest")
	if err != nil {
		w.t.Fatal(err)
	}
	w.mu.Lock()
	w.conn = c
	w.mu.Unlock()
	w.t.Cleanup(func() { c.Close(context.Background()) })
}

// change moves relayName to the next address and returns it and when the
// COMMIT returned.
func (w *relayWorld) change() (string, time.Time) {
	w.t.Helper()
	w.last = w.last%250 + 1
	addr := fmt.Sprintf("192.0.2.%d", w.last)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.conn.Exec(ctx, "UPDATE pgcluster_nodes SET address = $1 WHERE name = 'n0'", addr); err != nil {
		w.t.Fatalf("change to %s: %v", addr, err)
	}
	return addr, time.Now()
}

// fleetConns counts the registry sessions of the fleet's instances.
func (w *relayWorld) fleetConns() (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int
	w.mu.Lock()
	defer w.mu.Unlock()
	err := w.conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'coredns-pgcluster'").Scan(&n)
	return n, err
}

// connsAtMost waits until the fleet holds at most max sessions.
func (w *relayWorld) connsAtMost(max int) func() error {
	return func() error {
		n, err := w.fleetConns()
		if err != nil {
			return err
		}
		if n > max {
			return fmt.Errorf("%d registry sessions from the fleet, want at most %d", n, max)
		}
		return nil
	}
}

// watchConns samples the fleet's sessions every 50 ms until stopped, and
// returns the most seen.
func (w *relayWorld) watchConns() (stop func() (int, error)) {
	var most atomic.Int64
	var firstErr error
	done, quit := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			n, err := w.fleetConns()
			if err != nil && firstErr == nil {
				firstErr = err
			}
			if int64(n) > most.Load() {
				most.Store(int64(n))
			}
			select {
			case <-quit:
				return
			case <-t.C:
			}
		}
	}()
	return func() (int, error) {
		close(quit)
		<-done
		return int(most.Load()), firstErr
	}
}

// serve answers addr for relayName at ins, each: nil, or why not.
func serves(ins []*Instance, addr string) func() error {
	return func() error {
		for _, in := range ins {
			m, err := Exchange("udp", in.Addr(), relayName, dns.TypeA)
			if err != nil {
				return err
			}
			if got := Addrs(m); m.Rcode != dns.RcodeSuccess || !slices.Equal(got, []string{addr}) {
				return fmt.Errorf("%s answers %s %v, want %s", in.Addr(), dns.RcodeToString[m.Rcode], got, addr)
			}
		}
		return nil
	}
}

// servedPoll is how often servedAt asks each instance: often enough for
// the figures, seldom enough that 20 instances' answers do not load the
// machine (20 instances polled every millisecond would be 20,000 queries
// a second on the cores that run them).
const servedPoll = 3 * time.Millisecond

// servedAt waits until every instance answers addr and returns, for each,
// when it first did (polled every servedPoll), or fails after timeout.
func servedAt(t testing.TB, ins []*Instance, addr string, timeout time.Duration) []time.Time {
	t.Helper()
	at := make([]time.Time, len(ins))
	errs := make([]error, len(ins))
	deadline := time.Now().Add(timeout)
	var wg sync.WaitGroup
	for i, in := range ins {
		wg.Go(func() {
			c := &dns.Client{Net: "udp", Timeout: 500 * time.Millisecond}
			m := new(dns.Msg)
			m.SetQuestion(relayName, dns.TypeA)
			for {
				r, _, err := c.Exchange(m, in.Addr())
				if err == nil && r.Rcode == dns.RcodeSuccess && slices.Equal(Addrs(r), []string{addr}) {
					at[i] = time.Now()
					return
				}
				if time.Now().After(deadline) {
					if err == nil {
						err = fmt.Errorf("answers %s %v", dns.RcodeToString[r.Rcode], Addrs(r))
					}
					errs[i] = fmt.Errorf("%s does not answer %s after %s: %v", in.Addr(), addr, timeout, err)
					return
				}
				time.Sleep(servedPoll)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return at
}

// latest is the last of times.
func latest(times []time.Time) time.Time {
	var l time.Time
	for _, x := range times {
		if x.After(l) {
			l = x
		}
	}
	return l
}

// noServfail queries every instance of ins in turn until stopped, and
// returns the answers that were not NOERROR (timeouts of a loaded machine
// apart).
func noServfail(ins []*Instance) (stop func() []string) {
	var bad []string
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			for _, in := range ins {
				select {
				case <-quit:
					return
				default:
				}
				m, err := Exchange("udp", in.Addr(), relayName, dns.TypeA)
				if err == nil && m.Rcode != dns.RcodeSuccess {
					bad = append(bad, in.Addr()+": "+dns.RcodeToString[m.Rcode])
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	return func() []string {
		close(quit)
		<-done
		return bad
	}
}

// roles reads each instance's relay role.
func roles(t testing.TB, ins []*Instance) []string {
	t.Helper()
	out, err := rolesOf(ins)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// rolesOf is roles, with a failed scrape of /metrics returned as an error
// (for a wait to try again: one scrape may miss its deadline on a loaded
// machine).
func rolesOf(ins []*Instance) ([]string, error) {
	out := make([]string, len(ins))
	for i, in := range ins {
		body, err := get(in.MetricsURL())
		if err != nil {
			return nil, fmt.Errorf("metrics of %s: %v", in.Addr(), err)
		}
		for _, r := range []string{"follower", "reader", "local"} {
			if v, _ := metricValue(body, `coredns_pgcluster_relay_role{role="`+r+`",zone="`+Zone+`"}`); v == 1 {
				out[i] = r
			}
		}
	}
	return out, nil
}

// follower returns the index of the one follower, waiting for there to be
// exactly one and every other instance a reader.
func (w *relayWorld) follower(ins []*Instance) int {
	w.t.Helper()
	return oneFollower(w.t, ins, 15*time.Second)
}

// oneFollower waits up to timeout until exactly one of ins follows the
// registry and every other reads its copy, and returns the follower's
// index.
func oneFollower(t testing.TB, ins []*Instance, timeout time.Duration) int {
	t.Helper()
	f := -1
	Eventually(t, timeout, func() error {
		rs, err := rolesOf(ins)
		if err != nil {
			return err
		}
		f = slices.Index(rs, "follower")
		if f < 0 || slices.Index(rs[f+1:], "follower") >= 0 {
			return fmt.Errorf("roles %v: want one follower", rs)
		}
		for i, r := range rs {
			if i != f && r != "reader" {
				return fmt.Errorf("roles %v: want one follower, readers", rs)
			}
		}
		return nil
	})
	return f
}

// sameSerial checks that every instance serves the same SOA serial, its
// registry_version.
func sameSerial(t testing.TB, ins []*Instance) func() error {
	return func() error {
		var want uint32
		for i, in := range ins {
			m, err := Exchange("udp", in.Addr(), Zone, dns.TypeSOA)
			if err != nil {
				return err
			}
			if len(m.Answer) == 0 {
				return fmt.Errorf("%s: no SOA", in.Addr())
			}
			s := m.Answer[0].(*dns.SOA).Serial
			if i == 0 {
				want = s
			}
			v := metric(t, in, `coredns_pgcluster_registry_version{zone="`+Zone+`"}`)
			if s != want || uint32(v) != s {
				return fmt.Errorf("%s serves serial %d (registry_version %v), the first instance %d", in.Addr(), s, v, want)
			}
		}
		return nil
	}
}

// measureChanges makes n changes, each once the last is served by all, and
// returns how long after each COMMIT the last instance answered it, and
// the follower (ins[f]) did.
func (w *relayWorld) measureChanges(ins []*Instance, f, n int, bound time.Duration) (all, follower []time.Duration) {
	w.t.Helper()
	for range n {
		addr, at := w.change()
		times := servedAt(w.t, ins, addr, bound)
		all = append(all, latest(times).Sub(at))
		follower = append(follower, times[f].Sub(at))
	}
	return all, follower
}

// TestRelay checks the registry relay on a small fleet (make test): one
// follower of PostgreSQL, the others fed through Redis; the follower killed;
// PostgreSQL stopped; Redis stopped; a forged copy. BenchmarkFleetRelay
// measures the figures on 20 instances.
func TestRelay(t *testing.T) {
	const n = 4
	begin := time.Now()
	w := newRelayWorld(t, n)
	t.Logf("relay: %d instances answering after %v", n, time.Since(begin).Round(time.Millisecond))
	runRelay(t, w, 10, func(format string, args ...any) {
		t.Logf("%6.2fs "+format, append([]any{time.Since(begin).Seconds()}, args...)...)
	})
}

// BenchmarkFleetRelay runs TestRelay's steps on 20 bin/coredns instances, a
// real redis-server and PostgreSQL on loopback, with 100 changes for the
// COMMIT -> answer figures; it prints every figure. b.N is ignored: one run is
// one measurement.
//
//	go test -run '^$' -bench FleetRelay -benchtime 1x ./test/
func BenchmarkFleetRelay(b *testing.B) {
	const n, changes = 20, 100
	begin := time.Now()
	w := newRelayWorld(b, n)
	fmt.Printf("relay: %d instances answering %v after their start\n", n, time.Since(begin).Round(time.Millisecond))
	runRelay(b, w, changes, func(format string, args ...any) { fmt.Printf(format+"\n", args...) })
}

// BenchmarkRelayStall counts the registry sessions a fleet of 20
// bin/coredns instances with the relay and the default relay_grace opens
// while Redis stalls (SIGSTOP) for 600 ms and for 10 s: each reader serves
// its copy for the grace and a random part of another before it follows
// PostgreSQL itself, so a stall shorter than the grace opens none beyond
// the follower's. Sessions are sampled every 50 ms in pg_stat_activity,
// from the stall to 5 s after Redis returned, and the fleet is back to one
// session before the next stall. b.N is ignored: one run is one
// measurement.
//
//	go test -run '^$' -bench '^BenchmarkRelayStall$' -benchtime 1x ./test/
func BenchmarkRelayStall(b *testing.B) {
	const n = 20
	w := newRelayWorldGrace(b, n, "")
	Eventually(b, 20*time.Second, serves(w.ins, "192.0.2.1"))
	Eventually(b, 20*time.Second, w.connsAtMost(1))
	for _, d := range []time.Duration{600 * time.Millisecond, 10 * time.Second} {
		stop := w.watchConns()
		if err := w.rs.Freeze(); err != nil {
			b.Fatal(err)
		}
		time.Sleep(d) // the stall
		if err := w.rs.Thaw(); err != nil {
			b.Fatal(err)
		}
		during, err := stop()
		if err != nil {
			b.Errorf("sampling pg_stat_activity: %v", err)
		}
		stop = w.watchConns()
		time.Sleep(5 * time.Second) // the window after, observed
		after, err := stop()
		if err != nil {
			b.Errorf("sampling pg_stat_activity: %v", err)
		}
		fmt.Printf("relay stall: Redis stopped (SIGSTOP) for %v, %d instances, relay_grace at its default (%v): at most %d registry sessions from the fleet during the stall, %d in the 5 s after it\n",
			d, n, 10*time.Second, during, after)
		b.ReportMetric(float64(during), fmt.Sprintf("sessions-during-%v", d))
		Eventually(b, 30*time.Second, w.connsAtMost(1))
	}
}

// runRelay runs the numbered steps below on w, with changes changes for step
// 2, bounding every wait generously (the figures are reported, not asserted).
func runRelay(t testing.TB, w *relayWorld, changes int, report func(string, ...any)) {
	ins := w.ins
	n := len(ins)
	Eventually(t, 20*time.Second, serves(ins, "192.0.2.1"))

	// 1. One session from the fleet: the follower's.
	Eventually(t, 10*time.Second, w.connsAtMost(1))
	f := w.follower(ins)
	conns, err := w.fleetConns()
	if err != nil {
		t.Fatal(err)
	}
	report("relay: %d registry sessions in pg_stat_activity from the fleet of %d (application_name coredns-pgcluster)", conns, n)
	stopConns := w.watchConns()

	// 2. COMMIT -> answered by all, the same serial everywhere.
	lat, byFollower := w.measureChanges(ins, f, changes, 10*time.Second)
	report("relay: COMMIT -> answered by all %d instances (polled every %v), over %d changes: p50 %v, p90 %v, p99 %v, max %v",
		n, servedPoll, changes, percentile(lat, 50), percentile(lat, 90), percentile(lat, 99), percentile(lat, 100))
	report("relay: COMMIT -> answered by the follower: p50 %v, p90 %v, p99 %v, max %v",
		percentile(byFollower, 50), percentile(byFollower, 90), percentile(byFollower, 99), percentile(byFollower, 100))
	Eventually(t, 5*time.Second, sameSerial(t, ins))
	for i, in := range ins {
		if i != f && metric(t, in, `coredns_pgcluster_relay_lag_seconds_count{zone="`+Zone+`"}`) == 0 {
			t.Errorf("reader %s observed no relay lag", in.Addr())
		}
	}

	// 3. The follower killed: a change right after is served by every
	// other instance within the lease TTL and a second; no SERVFAIL.
	rest := slices.Delete(slices.Clone(ins), f, f+1)
	watch := noServfail(rest)
	ins[f].Kill()
	addr, at := w.change()
	took := latest(servedAt(t, rest, addr, 3*(relayLeaseTTL+time.Second))).Sub(at)
	report("relay: follower SIGKILLed, a change made right after served by the other %d within %v (bound: lease TTL %v + 1s)",
		len(rest), took, relayLeaseTTL)
	if bad := watch(); len(bad) > 0 {
		t.Errorf("answers other than NOERROR after the follower was killed: %v", bad)
	}
	most, err := stopConns()
	if err != nil {
		t.Errorf("sampling pg_stat_activity: %v", err)
	}
	report("relay: at most %d registry sessions from the fleet of %d meanwhile (sampled every 50ms)", most, n)
	if most > 2 {
		t.Errorf("up to %d registry sessions from the fleet, want at most 2", most)
	}
	ins = rest
	w.follower(ins)

	// 6. A forged copy written straight into Redis: no answer moves, every
	// reader counts it.
	addr = w.forge(ins, addr, report)

	// 4. PostgreSQL stopped: a new instance answers the last zone from
	// Redis; PostgreSQL back: changes flow again, to it too.
	if err := w.pg.Stop(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	late := StartFleetInstance(t, w.corefile)
	report("relay: PostgreSQL stopped: a new instance answered the last zone %v after its start", time.Since(start).Round(time.Millisecond))
	if err := serves([]*Instance{late}, addr)(); err != nil {
		t.Fatalf("a new instance with PostgreSQL down: %v", err)
	}
	if err := w.pg.Start(); err != nil {
		t.Fatal(err)
	}
	w.connect()
	ins = append(ins, late)
	addr, at = w.change()
	took = latest(servedAt(t, ins, addr, 30*time.Second)).Sub(at)
	report("relay: PostgreSQL back: a change served by all %d within %v", len(ins), took)
	Eventually(t, 10*time.Second, w.connsAtMost(2))

	// 5. Redis stopped: the readers serve their copy for relay_grace (no
	// new registry session: a fleet of hundreds would exhaust
	// max_connections), then every instance follows PostgreSQL itself, a
	// change is served by all; Redis back: the sessions fall back to at
	// most 2.
	stopped := time.Now()
	w.rs.Stop()
	stopConns = w.watchConns()
	time.Sleep(relayTestGrace * 3 / 4) // the window observed, not a wait for something
	most, err = stopConns()
	if err != nil {
		t.Errorf("sampling pg_stat_activity: %v", err)
	}
	report("relay: Redis stopped: at most %d registry sessions from the fleet of %d in the first %v (relay_grace %v)", most, len(ins), relayTestGrace*3/4, relayTestGrace)
	if most > 2 {
		t.Errorf("up to %d registry sessions from the fleet within relay_grace of Redis stopping, want at most 2 (the follower's, and a hand-over's)", most)
	}
	Eventually(t, 15*time.Second, func() error {
		n, err := w.fleetConns()
		if err == nil && n != len(ins) {
			err = fmt.Errorf("%d registry sessions from the fleet of %d with Redis down", n, len(ins))
		}
		return err
	})
	addr, at = w.change()
	took = latest(servedAt(t, ins, addr, 10*time.Second)).Sub(at)
	report("relay: Redis stopped: %d sessions, one per instance, %v after the stop; a change served by all within %v", len(ins), at.Sub(stopped).Round(time.Millisecond), took)
	if err := w.rs.Start(); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	Eventually(t, 20*time.Second, w.connsAtMost(2))
	report("relay: Redis back: registry sessions down to at most 2 within %v", time.Since(start).Round(time.Millisecond))
	w.follower(ins)
	addr, _ = w.change()
	servedAt(t, ins, addr, 10*time.Second)
	Eventually(t, 10*time.Second, w.connsAtMost(1))
}

// forge writes into Redis, without the secret, a copy that moves
// relayName elsewhere, and checks that no instance moves and every reader
// counts the copy rejected; then that a change flows again.
func (w *relayWorld) forge(ins []*Instance, addr string, report func(string, ...any)) string {
	t := w.t
	t.Helper()
	rejected := func(in *Instance) float64 {
		return metric(t, in, `coredns_pgcluster_relay_reads_total{result="rejected",zone="`+Zone+`"}`)
	}
	f := w.follower(ins)
	before := make([]float64, len(ins))
	for i, in := range ins {
		before[i] = rejected(in)
	}
	rdb := w.rs.Client(t)
	ctx := Ctx(t)
	key := relayPrefix + "{registry}:copy"
	v, err := rdb.HGet(ctx, key, "v").Int64()
	if err != nil {
		t.Fatalf("the copy's version: %v", err)
	}
	forged := `[{"c":"local","n":"n0","a":"192.0.2.254","p":5432,"r":"primary","age":0}]`
	next := strconv.FormatInt(v+1, 10)
	// A version after the follower's, with its log entry, an unsigned
	// head, and its publication: as the follower's script would write it.
	head := fmt.Sprintf(`{"term":1,"v":%s,"prev":%d,"digest":"%s","n":1}`, next, v, strings.Repeat("0", 64))
	if err := rdb.HSet(ctx, key, "f:"+clusterFieldOf("local"), forged, "v", next, "head", head).Err(); err != nil {
		t.Fatal(err)
	}
	rdb.ZAdd(ctx, relayPrefix+"{registry}:log", redis.Z{Score: float64(v + 1), Member: next + " " + strconv.FormatInt(v, 10) + " =\x00" + clusterFieldOf("local")})
	rdb.Publish(ctx, relayPrefix+"registry", next)
	Eventually(t, 10*time.Second, func() error {
		for i, in := range ins {
			if i != f && rejected(in) <= before[i] {
				return fmt.Errorf("reader %s has not counted the forged copy", in.Addr())
			}
		}
		return nil
	})
	if err := serves(ins, addr)(); err != nil {
		t.Fatalf("after a forged copy: %v", err)
	}
	report("relay: a forged copy (unsigned head, version %s) counted rejected by all %d readers; every instance still answers %s",
		next, len(ins)-1, addr)
	// The follower writes above it; every instance follows again.
	next2, _ := w.change()
	servedAt(t, ins, next2, 10*time.Second)
	return next2
}

// clusterFieldOf is the copy's field of a cluster (relay_redis.go).
func clusterFieldOf(cluster string) string { return "n:" + cluster }

// TestRelayReload reloads the Corefile of the fleet's follower: the new
// instance answers at once from the rows the old one served, the old one
// gives the lease up, and the new one follows PostgreSQL for the fleet
// in its place: a change is served, and one registry session is left.
func TestRelayReload(t *testing.T) {
	w := &relayWorld{t: t, pg: Registry(t), rs: redistest.Start(t), last: 1}
	w.pg.MustExec(t, "INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES ('local', 'n0', '192.0.2.1', 5432, 'primary')")
	w.connect()
	port, err := proc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	corefile := func(ttl int) string {
		return fmt.Sprintf("%s:%d {\n bind 127.0.0.1\n pgcluster {\n  postgres %s\n  redis %s\n  redis_prefix %s\n  redis_secret %s\n  ttl %d\n }\n}\n",
			Zone, port, w.pg.DSN(""), w.rs.URL(), relayPrefix, relaySecret, ttl)
	}
	s := StartCoreDNS(t, corefile(5))
	// The in-process server stands for a fleet instance: serves asks its
	// DNS address.
	in := []*Instance{{Instance: &coretest.Instance{Ports: coretest.Ports{DNS: port}}}}
	Eventually(t, 10*time.Second, serves(in, "192.0.2.1"))
	Eventually(t, 10*time.Second, w.connsAtMost(1))
	addr, _ := w.change()
	Eventually(t, 10*time.Second, serves(in, addr))

	start := time.Now()
	if err := s.Restart(corefile(7)); err != nil {
		t.Fatal(err)
	}
	t.Logf("Corefile reload of the follower took %v", time.Since(start).Round(time.Millisecond))
	if err := serves(in, addr)(); err != nil {
		t.Fatalf("right after the reload: %v", err)
	}
	addr, at := w.change()
	took := latest(servedAt(t, in, addr, 10*time.Second)).Sub(at)
	t.Logf("a change made after the reload served within %v", took)
	if took >= relayLeaseTTL {
		// The new instance waited for the lease to expire.
		t.Errorf("a change after the reload took %v: the old instance kept the registry lease", took)
	}
	Eventually(t, 10*time.Second, func() error {
		m, err := Exchange("udp", s.UDP, relayName, dns.TypeA)
		if err != nil {
			return err
		}
		if len(m.Answer) == 0 || m.Answer[0].Header().Ttl != 7 {
			return fmt.Errorf("answer %v: want the new instance's TTL 7", m.Answer)
		}
		return nil
	})
	Eventually(t, 10*time.Second, func() error {
		n, err := w.fleetConns()
		if err == nil && n != 1 {
			err = fmt.Errorf("%d registry sessions after the reload, want 1", n)
		}
		return err
	})
}
