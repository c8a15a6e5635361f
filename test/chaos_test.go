package test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// The chaos run's check settings, tight enough that a backend leaves every
// answer within seconds.
const (
	chaosInterval = 500 * time.Millisecond
	chaosTimeout  = 200 * time.Millisecond
	// chaosPGInterval and chaosPGTimeout are the interval and timeout with
	// check postgres, where a probe is a PostgreSQL session (a backend
	// forked, a startup exchange, a query), not a TCP handshake. Under this
	// run's load on a 2-core machine such a connect takes 90-400 ms; at a
	// 400 ms timeout (interval 500 ms or 1 s alike) the instances logged
	// 54-142 check_timeout verdicts per run, and each run had 627-1,685
	// wrong answers, all nodes that were up left out after such a timeout
	// (four runs). So the timeout is 800 ms, under the default 1 s, and the
	// interval, which must exceed it, 1 s, half the default; the budget
	// below grows with both.
	chaosPGInterval = time.Second
	chaosPGTimeout  = 800 * time.Millisecond
	chaosRise       = 2
	chaosFall       = 2
	// chaosLease is the lease of a backend's prober (lock's default: three
	// intervals and the timeout): the longest another instance waits
	// before probing a backend whose prober is gone (SIGKILLed, frozen,
	// cut off by a Redis outage), which is the propagation margin.
	chaosLease = 3*chaosInterval + chaosTimeout
	// chaosBudget is how long a change may take to reach every answer:
	// fall probes an interval apart, the last one's timeout, and the
	// margin. A backend down longer must not be answered; a backend up
	// longer must be; a role swapped longer ago must show.
	chaosBudget = chaosFall*chaosInterval + chaosTimeout + chaosLease
	// chaosPGLease and chaosPGBudget are chaosLease and chaosBudget with
	// check postgres's interval and timeout.
	chaosPGLease  = 3*chaosPGInterval + chaosPGTimeout
	chaosPGBudget = chaosFall*chaosPGInterval + chaosPGTimeout + chaosPGLease
	// chaosPGFollowTimeout bounds the wait for one follower of the registry
	// before a switchover's roles are recorded there: an instance the
	// Redis attacker's second fleet sent to PostgreSQL stays there for up
	// to 40 s (relay.go's relayHold, doubled twice); the answers do not
	// wait on the registry with check postgres, so neither does the
	// switchover, only its record.
	chaosPGFollowTimeout = 90 * time.Second
	// chaosTTL is the instances' ttl; a Corefile reload toggles it with
	// chaosTTLReloaded.
	chaosTTL, chaosTTLReloaded = 5, 7
	// chaosDefaultDuration is the run's length inside make test;
	// CHAOS_DURATION sets another (make chaos: 120s).
	chaosDefaultDuration = 20 * time.Second
	// chaosMaxTimeouts is the share of queries that may time out, in percent.
	chaosMaxTimeouts = 0.01
	// chaosStepTimeout bounds each wait of the script.
	chaosStepTimeout = 30 * time.Second
)

// The chaos run's backends: the cluster local's four nodes, flapped two
// pairs at a time, and the cluster pgc's primary and standby, whose roles
// the run swaps in the registry.
var (
	chaosLocalHosts = []string{"127.0.0.61", "127.0.0.62", "127.0.0.63", "127.0.0.64"}
	chaosRoleHosts  = [2]string{"127.0.0.71", "127.0.0.72"}
)

// Instance slots: dnsperf loads the first two; the second is reloaded
// under that load; the third is killed and started again.
const (
	chaosReloadSlot = 1
	chaosKillSlot   = 2
)

// TestChaos runs a fleet of three bin/coredns (built with -race under make
// test and make chaos) with a real redis-server, the registry's PostgreSQL
// and real TCP backends checked with check tcp (CHAOS_CHECK=postgres: real
// PostgreSQL servers checked with check postgres and its role sessions,
// the switchovers real: see chaos_pg_test.go), under a steady load from
// dnsperf on two instances,
// for CHAOS_DURATION (default 20s). Meanwhile the backends of cluster local
// flap, one of each pair down at a time, and a script, in turn, stops and
// starts Redis, freezes it (SIGSTOP) and resumes it, swaps the roles of
// cluster pgc in the registry, restarts PostgreSQL, freezes and resumes it,
// fails the registry over to its streaming standby (the fleet's DSN names
// both, with target_session_attrs=read-write: the primary is stopped at
// once, the standby promoted, a new standby made in the old primary's
// place), SIGKILLs an instance and starts it again, and reloads another's
// changed Corefile (SIGUSR1), while a Redis attacker (chaosAttacker; off
// with CHAOS_ATTACKER=0) writes there at random what someone without the
// secret might. A checker asks every instance for local.,
// primary.pgc. and standby.pgc. about 33 times a second each. It fails on
// any SERVFAIL, any wrong answer (an address whose backend had been down
// longer than chaosBudget, a backend up that long left out, a primary. or
// standby. answer naming a node that had not held that role within
// chaosBudget), and on timeouts over 0.01% of all queries, dnsperf's and
// the checker's. The report gives the counts, how long changes took to
// leave the answers, how long a frozen Redis and a frozen registry took to
// be noticed, with the slowest answer meanwhile, and how long the fleet
// took to follow each registry fail-over.
func TestChaos(t *testing.T) {
	duration := chaosDuration(t)
	bin, err := exec.LookPath(dnsperfPath)
	if err != nil {
		t.Fatalf("dnsperf is missing (the setup script installs it: apt-get install -y dnsperf): %v", err)
	}
	r := newChaosRun(t)
	stalls := startStallMeter()
	began := time.Now()
	for _, slot := range []int{0, 1, 2} {
		r.watch(slot)
	}
	perf := []*dnsperfRun{startDnsperf(t, bin, r.ins[0].Addr(), chaosQueries), startDnsperf(t, bin, r.ins[1].Addr(), chaosQueries)}
	stopFlaps := r.flap()
	stopAttack := func() {}
	if chaosAttackerOn() {
		stopAttack = r.attack()
	}

	steps := []struct {
		name string
		run  func()
	}{
		{"Redis stopped and started", r.redisRestart},
		{"Redis frozen and resumed", r.redisFreeze},
		{"roles swapped", r.swap},
		{"PostgreSQL stopped and started", r.pgRestart},
		{"PostgreSQL frozen and resumed", r.pgFreeze},
		{"registry failed over", r.failover},
		{"instance SIGKILLed and started", r.kill},
		{"Corefile reloaded", r.reload},
		{"roles swapped", r.swap},
	}
	deadline := began.Add(duration)
	done := map[string]int{}
	for i := 0; i < len(steps) || time.Now().Before(deadline); i++ {
		s := steps[i%len(steps)]
		start := time.Now()
		r.event("%s", s.name)
		s.run()
		done[s.name]++
		r.alive()
		t.Logf("%6.1fs  %s (%v)", time.Since(began).Seconds(), s.name, time.Since(start).Round(time.Millisecond))
	}

	flaps := stopFlaps()
	stopAttack()
	for _, stop := range r.stops {
		stop()
	}
	var reports []dnsperfReport
	for _, d := range perf {
		reports = append(reports, d.stop(t))
	}
	r.report(time.Since(began), done, flaps, reports, stalls.end())
}

// chaosDuration reads CHAOS_DURATION.
func chaosDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv("CHAOS_DURATION")
	if v == "" {
		return chaosDefaultDuration
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("CHAOS_DURATION=%q is not a positive duration; give one such as 120s", v)
	}
	return d
}

// chaosRun is the fleet under chaos and what the script measured.
type chaosRun struct {
	t        *testing.T
	pg       *pgtest.Postgres // the registry's primary
	standby  *pgtest.Postgres // its streaming standby (nil while remade)
	rs       *redistest.Server
	local    []*chaosBackend
	roles    *chaosRoles // cluster pgc with check tcp: roles swapped in the registry
	pgc      *chaosPGC   // cluster pgc with check postgres: real servers
	corefile string
	ins      []*Instance // by slot
	stops    []func()    // the checker's, by slot
	next     int         // the next incarnation's number
	checker  *chaosChecker
	ttl      int            // the reload slot's ttl now
	attacker *chaosAttacker // nil with CHAOS_ATTACKER=0

	// windows are the faults the report looks at: when each began and
	// ended, and how long the fleet took to notice it.
	windows []chaosWindow
	// timeline is what the script did, and when.
	timeline []string
}

// event adds a line to the timeline.
func (r *chaosRun) event(format string, args ...any) {
	r.timeline = append(r.timeline, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

// chaosWindow is a fault: noticed is how long the fleet took to notice
// it, first by the first instance, all by every one; failover, for a
// registry fail-over, how long it took to follow it.
type chaosWindow struct {
	what     string
	from, to time.Time
	noticed  chaosNoticed
	failover *chaosFailover
}

type chaosNoticed struct{ first, all time.Duration }

// newChaosRun starts Redis, the registry (a primary with its rows and a
// standby), the backends and three instances, and waits until they share
// the checks of all six.
func newChaosRun(t *testing.T) *chaosRun {
	mode := chaosCheckMode(t)
	r := &chaosRun{t: t, rs: redistest.Start(t), checker: &chaosChecker{}, ttl: chaosTTL}
	r.startRegistry()
	target, check := "", "tcp"
	if mode == "postgres" {
		r.pgc = startChaosPGC(t)
		target, check = r.pgc.localTarget(), chaosPGCheck
	}
	var rows []string
	for i, h := range chaosLocalHosts {
		b := r.backend(h, target)
		r.local = append(r.local, b)
		rows = append(rows, fmt.Sprintf("('local', 'n%d', '%s', %s, 'standby')", i, h, b.port))
	}
	if r.pgc != nil {
		rows = append(rows, r.pgc.rows()...)
	} else {
		for i, h := range chaosRoleHosts {
			b := r.backend(h, "")
			role := []string{"primary", "standby"}[i]
			rows = append(rows, fmt.Sprintf("('pgc', 'p%d', '%s', %s, '%s')", i+1, h, b.port, role))
		}
		r.roles = newChaosRoles(chaosRoleHosts)
	}
	r.pg.MustExec(t, "INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES "+strings.Join(rows, ", "))
	r.corefile = chaosCorefile(r.registryDSN(), r.rs.URL(), check, r.interval(), r.timeout())
	r.ins = startInstances(t, r.corefile, 3)
	r.stops = make([]func(), 3)
	r.coordinated()
	Eventually(t, chaosStepTimeout, answersExactly(r.ins, chaosLocalHosts))
	if r.pgc != nil {
		r.pgc.rig.ins = r.ins // the same slots: a restarted instance is counted too
		Eventually(t, chaosStepTimeout, answersOnly(r.ins, chaosPrimary, r.pgc.primary().host))
	}
	return r
}

// interval and timeout are the check's, budget how long a change may
// take to reach every answer.
func (r *chaosRun) interval() time.Duration {
	if r.pgc != nil {
		return chaosPGInterval
	}
	return chaosInterval
}

func (r *chaosRun) timeout() time.Duration {
	if r.pgc != nil {
		return chaosPGTimeout
	}
	return chaosTimeout
}

func (r *chaosRun) budget() time.Duration {
	if r.pgc != nil {
		return chaosPGBudget
	}
	return chaosBudget
}

// book returns when each node of cluster pgc held each role.
func (r *chaosRun) book() chaosRoleBook {
	if r.pgc != nil {
		return r.pgc.book
	}
	return r.roles
}

func (r *chaosRun) backend(host, target string) *chaosBackend {
	b, err := openChaosBackend(host, target)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(b.close)
	return b
}

func (r *chaosRun) targets() int { return len(chaosLocalHosts) + len(chaosRoleHosts) }

// chaosCorefile is the fleet's Corefile: checks every interval,
// shared through Redis; dsn is quoted (a key=value DSN has spaces); check
// is the check line's argument (tcp, or postgres and its options).
func chaosCorefile(dsn, redisURL, check string, interval, timeout time.Duration) string {
	return fmt.Sprintf(`%s:%s {
 bind 127.0.0.1
 prometheus 127.0.0.1:%s
 pgcluster {
  postgres %q
  allow_loopback
  ttl %d
  check %s
  interval %s
  timeout %s
  rise %d
  fall %d
  redis %s
 }
}
`, Zone, PortPlaceholder, MetricsPlaceholder, dsn, chaosTTL, check, interval, timeout, chaosRise, chaosFall, redisURL)
}

// watch starts the checker on the instance in slot, as a new incarnation.
func (r *chaosRun) watch(slot int) {
	r.stops[slot] = r.checker.watch(r.next, r.ins[slot].Addr())
	r.event("checker on incarnation %d: slot %d, %s, pid %d", r.next, slot, r.ins[slot].Addr(), r.ins[slot].Pid())
	r.next++
}

// flap flaps the local backends, each pair on its own, until the returned
// function is called; it returns how many flaps were made.
func (r *chaosRun) flap() func() int {
	stop := make(chan struct{})
	type result struct {
		n   int
		err error
	}
	results := make(chan result, 2)
	for _, pair := range [][2]*chaosBackend{{r.local[0], r.local[1]}, {r.local[2], r.local[3]}} {
		go func() {
			n, err := flapPair(pair, stop)
			results <- result{n, err}
		}()
	}
	return func() int {
		close(stop)
		total := 0
		for range 2 {
			res := <-results
			total += res.n
			if res.err != nil {
				r.t.Errorf("flapping backends: %v", res.err)
			}
		}
		return total
	}
}

// untilAll waits until the sample name of every instance is want, and
// returns how long the first and the slowest instance took, from start.
func (r *chaosRun) untilAll(start time.Time, name string, want float64) chaosNoticed {
	r.t.Helper()
	seen := make([]bool, len(r.ins))
	var n chaosNoticed
	Eventually(r.t, chaosStepTimeout, func() error {
		var err error
		for i, in := range r.ins {
			if seen[i] {
				continue
			}
			if v, merr := chaosMetric(in, name); merr != nil || v != want {
				err = fmt.Errorf("%s on %s is not %v after %v (%v, %v)", name, in.Addr(), want, time.Since(start), v, merr)
				continue
			}
			seen[i] = true
			n.all = time.Since(start)
			if n.first == 0 {
				n.first = n.all
			}
		}
		return err
	})
	return n
}

// coordinated waits until every instance is coordinated and the leases
// they hold add up to the targets.
func (r *chaosRun) coordinated() {
	r.t.Helper()
	Eventually(r.t, chaosStepTimeout, func() error {
		total := 0.0
		for _, in := range r.ins {
			if v, err := chaosMetric(in, modeCoordinated); err != nil || v != 1 {
				return fmt.Errorf("%s is not coordinated (%v, %v)", in.Addr(), v, err)
			}
			v, err := chaosMetric(in, leasesMetric)
			if err != nil {
				return err
			}
			total += v
		}
		if int(total) != r.targets() {
			return fmt.Errorf("%v leases held, want %d", total, r.targets())
		}
		return nil
	})
}

// followed waits up to timeout until every instance follows the registry:
// itself (the follower, or local) or through a copy some instance follows
// it for (a reader while a follower is). Under the attacker, an instance
// that refused a forged copy follows PostgreSQL itself for a hold that
// doubles while the forgeries go on (up to minutes), and a lease forged
// without a TTL is taken over while its last follower has yet to find it
// lost: so neither "exactly one follower" nor "every other a reader" is
// what the script can wait for, only that nobody reads a copy nobody
// writes. A failed scrape is taken for not yet (see chaosMetric).
func (r *chaosRun) followed(timeout time.Duration) {
	r.t.Helper()
	Eventually(r.t, timeout, func() error {
		var rs []string
		for _, in := range r.ins {
			role := ""
			for _, name := range []string{"follower", "reader", "local"} {
				v, err := chaosMetric(in, `coredns_pgcluster_relay_role{role="`+name+`",zone="`+Zone+`"}`)
				if err != nil {
					return err
				}
				if v == 1 {
					role = name
				}
			}
			rs = append(rs, role)
		}
		n := map[string]int{}
		for _, role := range rs {
			n[role]++
		}
		if n[""] > 0 || n["reader"] > 0 && n["follower"] == 0 {
			return fmt.Errorf("roles %v: want each instance following the registry, itself or through a follower", rs)
		}
		return nil
	})
}

// chaosMetric reads one sample of an instance's metrics. An error is the
// script's to wait out, not a failure: on a loaded host a scrape of an
// instance under -race can miss its 2 s timeout, and the answers, which
// the checker judges, are what the run is about.
func chaosMetric(in *Instance, name string) (float64, error) {
	body, err := get(in.MetricsURL())
	if err != nil {
		return 0, fmt.Errorf("metrics of %s: %w", in.Addr(), err)
	}
	v, _ := metricValue(body, name)
	return v, nil
}

func (r *chaosRun) redisRestart() {
	from := time.Now()
	r.rs.Stop()
	noticed := r.untilAll(from, modeLocal, 1)
	if err := r.rs.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.windows = append(r.windows, chaosWindow{what: "Redis stopped", from: from, to: time.Now(), noticed: noticed})
	r.coordinated()
}

func (r *chaosRun) redisFreeze() {
	from := time.Now()
	if err := r.rs.Freeze(); err != nil {
		r.t.Fatal(err)
	}
	noticed := r.untilAll(from, modeLocal, 1)
	time.Sleep(time.Second) // frozen a while longer, answering from local checks
	if err := r.rs.Thaw(); err != nil {
		r.t.Fatal(err)
	}
	r.windows = append(r.windows, chaosWindow{what: "Redis frozen", from: from, to: time.Now(), noticed: noticed})
	r.coordinated()
}

// swap swaps the roles of cluster pgc (with check postgres: a real
// switchover, the registry's roles updated after it), and waits until
// every instance answers the new primary before the script goes on (the
// checker judges whether that took longer than the budget). Only while every instance
// follows the registry, and never cut short by the next fault: a change
// made while an instance is cut off, or that it had no time to read before
// the registry froze, reaches it when it reconnects, after a backoff of up
// to 5 s, not within the budget.
func (r *chaosRun) swap() { r.swapAnswered() }

// swapAnswered is swap; it returns how long after the swap's COMMIT every
// instance answered the new primary (with check postgres: the new roles in
// the registry, as each node's TXT says).
//
// With the registry relay, following means that an instance follows
// PostgreSQL itself (the follower, or local) or reads the copy of one that
// does: after the follower is
// SIGKILLed, or gives its lease up in a long registry outage, nobody reads
// PostgreSQL until another takes the relay lease over (up to its 3 s TTL),
// while every instance's registry_up still says 1. A change committed then is
// served within the lease TTL and a reload (the relay's bound when its
// follower dies, docs/fleet.md), not within the checks' budget; so the swap
// waits until each reader has a follower (followed).
func (r *chaosRun) swapAnswered() time.Duration {
	if r.pgc != nil {
		return r.switchover()
	}
	r.untilAll(time.Now(), registryUp, 1)
	r.followed(chaosStepTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	primary, err := r.roles.swap(ctx, r.pg)
	if err != nil {
		r.t.Fatal(err)
	}
	committed := time.Now()
	Eventually(r.t, chaosStepTimeout, func() error {
		for _, in := range r.ins {
			m, err := Exchange("udp", in.Addr(), chaosPrimary, dns.TypeA)
			if err != nil {
				return err
			}
			if got := Addrs(m); len(got) != 1 || got[0] != primary {
				return fmt.Errorf("%s answers %v for %s, want %s", in.Addr(), got, chaosPrimary, primary)
			}
		}
		return nil
	})
	return time.Since(committed)
}

func (r *chaosRun) pgRestart() {
	from := time.Now()
	if err := r.pg.Stop(); err != nil {
		r.t.Fatal(err)
	}
	noticed := r.untilAll(from, registryUp, 0)
	if err := r.pg.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.windows = append(r.windows, chaosWindow{what: "registry stopped", from: from, to: time.Now(), noticed: noticed})
	r.swap()
}

func (r *chaosRun) pgFreeze() {
	from := time.Now()
	frozen := freeze(r.t, r.pg)
	noticed := r.untilAll(from, registryUp, 0)
	time.Sleep(time.Second) // frozen a while longer, answering from the snapshot
	thaw(frozen)
	r.windows = append(r.windows, chaosWindow{what: "registry frozen", from: from, to: time.Now(), noticed: noticed})
	r.swap()
}

// kill SIGKILLs the instance of the kill slot and starts a new one in its
// place (on a new port).
func (r *chaosRun) kill() {
	r.stops[chaosKillSlot]()
	r.ins[chaosKillSlot].Kill()
	r.ins[chaosKillSlot] = StartFleetInstance(r.t, r.corefile)
	r.watch(chaosKillSlot)
	r.coordinated()
}

// reload rewrites the Corefile of the reload slot's instance with another
// ttl and sends it SIGUSR1, as an operator would; dnsperf and the checker
// keep asking it meanwhile.
func (r *chaosRun) reload() {
	in := r.ins[chaosReloadSlot]
	path, err := confPath(in.Pid())
	if err != nil {
		r.t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		r.t.Fatal(err)
	}
	r.ttl = map[int]int{chaosTTL: chaosTTLReloaded, chaosTTLReloaded: chaosTTL}[r.ttl]
	changed := ttlLine.ReplaceAll(b, fmt.Appendf(nil, "${1}%d", r.ttl))
	if string(changed) == string(b) {
		r.t.Fatalf("no ttl line to change in %s:\n%s", path, b)
	}
	if err := os.WriteFile(path, changed, 0o644); err != nil {
		r.t.Fatal(err)
	}
	before := strings.Count(in.Log(), "Reloading complete")
	if err := syscall.Kill(in.Pid(), syscall.SIGUSR1); err != nil {
		r.t.Fatal(err)
	}
	Eventually(r.t, chaosStepTimeout, func() error {
		if strings.Count(in.Log(), "Reloading complete") == before {
			return fmt.Errorf("%s has not logged Reloading complete after SIGUSR1", in.Addr())
		}
		return nil
	})
	Eventually(r.t, chaosStepTimeout, func() error {
		m, err := Exchange("udp", in.Addr(), chaosLocal, dns.TypeA)
		if err != nil {
			return err
		}
		if len(m.Answer) == 0 || m.Answer[0].Header().Ttl != uint32(r.ttl) {
			return fmt.Errorf("after the reload to ttl %d, %s answers %v", r.ttl, in.Addr(), m.Answer)
		}
		return nil
	})
	r.coordinated()
}

// alive fails the test when an instance the script did not kill has
// exited: a crash.
func (r *chaosRun) alive() {
	r.t.Helper()
	for slot, in := range r.ins {
		if in.Exited() {
			r.t.Fatalf("the instance in slot %d (%s) exited on its own: a crash (its log follows at cleanup)", slot, in.Addr())
		}
	}
}
