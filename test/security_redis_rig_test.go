package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// The checks of the Redis attack rig: the README's example fleet, whose
// bound for a stopped backend to leave every answer is fall × interval +
// timeout + lease.
const (
	attackInterval = 500 * time.Millisecond
	attackTimeout  = 200 * time.Millisecond
	attackRise     = 2
	attackFall     = 2
	// attackLease is a node lease's TTL (lock's: three intervals and the
	// timeout): the longest a backend goes unprobed when its holder is gone.
	attackLease = 3*attackInterval + attackTimeout
	// attackBound is the promise: whatever someone without the secret
	// writes into Redis, a stopped backend, or a node the registry marks
	// unhealthy, leaves every instance's answers within it (2.9 s).
	attackBound = attackFall*attackInterval + attackTimeout + attackLease
	// attackMargin is what a loaded 2-core machine running -race builds
	// may add to it. The attacks this rig replays kept nodes in the answers
	// for 12 s to minutes: far beyond the bound and its margin.
	attackMargin = 3 * time.Second
	// attackHold is how long every instance must keep a node out once it
	// left, for it to count as gone (not flapping back).
	attackHold = 1500 * time.Millisecond
	// attackPoll is how often each instance is asked while a node leaves.
	attackPoll = 10 * time.Millisecond
	// attackSettle bounds the wait for the rig to be steady again.
	attackSettle = 30 * time.Second
	// attackInstances is the rig's fleet.
	attackInstances = 4
)

// The rig's nodes: cluster local's four, each a TCP listener on its own
// address, and the alias prod → local.
var attackHosts = []string{"127.0.0.81", "127.0.0.82", "127.0.0.83", "127.0.0.84"}

const attackAlias = "prod." + Zone

// redisRig is the fleet every Redis attack meets: four bin/coredns with
// check tcp and redis_secret on one redis-server, the registry relayed
// through it, and the attacker's own client to that Redis.
type redisRig struct {
	t        *testing.T
	pg       *pgtest.Postgres
	rs       *redistest.Server
	rdb      *redis.Client // the attacker's: no secret
	secret   string
	backends []*fleetBackend
	corefile string
	ins      []*Instance
	// restart: the last attack left the fleet in a state that cleaning
	// Redis does not undo (an instance holding a forged version in memory):
	// the next one starts on new instances.
	restart bool
}

func newRedisRig(t *testing.T) *redisRig {
	t.Helper()
	r := &redisRig{t: t, pg: Registry(t), rs: redistest.Start(t), secret: coretest.RandomHex(24)}
	r.rdb = r.rs.Client(t)
	var rows []string
	for i, h := range attackHosts {
		b := openFleetBackend(t, h)
		r.backends = append(r.backends, b)
		role := "standby"
		if i == 0 {
			role = "primary"
		}
		rows = append(rows, fmt.Sprintf("('local', 'n%d', '%s', %s, '%s')", i, b.host, b.port, role))
	}
	r.pg.MustExec(t, "INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES "+strings.Join(rows, ", ")+
		"; INSERT INTO pgcluster_aliases(alias, target) VALUES ('prod', 'local')")
	r.corefile = r.corefileOf(r.pg.DSN(""), r.secret)
	r.ins = startTogether(t, r.corefile, attackInstances)
	if err := r.steady(); err != nil {
		t.Fatalf("the rig is not steady after its start: %v", err)
	}
	return r
}

// corefileOf is the rig's Corefile for the registry at dsn and secret.
func (r *redisRig) corefileOf(dsn, secret string) string {
	return securityCorefile(dsn, "check tcp",
		"interval "+attackInterval.String(), "timeout "+attackTimeout.String(),
		"rise "+strconv.Itoa(attackRise), "fall "+strconv.Itoa(attackFall),
		"redis "+r.rs.URL(), "redis_secret "+secret)
}

// startTogether starts n instances at once, as a fleet's hosts boot, and
// waits until each answers.
func startTogether(t testing.TB, corefile string, n int) []*Instance {
	t.Helper()
	ins := make([]*Instance, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ins[i] = StartFleetInstanceNoWait(t, corefile) })
	}
	wg.Wait()
	for _, in := range ins {
		in.WaitReady(t, fleetReadyTimeout)
	}
	return ins
}

// steady waits until every instance coordinates, the leases add up to the
// nodes, one instance follows the registry, and every instance answers
// every node.
func (r *redisRig) steady() error {
	return pgtest.WaitFor(attackSettle, func() error {
		if err := r.coordinated(); err != nil {
			return err
		}
		if err := r.oneFollower(); err != nil {
			return err
		}
		return answersExactly(r.ins, attackHosts)()
	})
}

// coordinated is the coordinated check without failing the test on a
// metrics scrape (an instance may be the one in trouble).
func (r *redisRig) coordinated() error {
	total := 0.0
	for _, in := range r.ins {
		body, err := get(in.MetricsURL())
		if err != nil {
			return err
		}
		if v, _ := metricValue(body, modeCoordinated); v != 1 {
			return fmt.Errorf("%s is not coordinated", in.Addr())
		}
		v, _ := metricValue(body, leasesMetric)
		total += v
	}
	if int(total) != len(attackHosts) {
		return fmt.Errorf("%v node leases held, want %d", total, len(attackHosts))
	}
	return nil
}

func (r *redisRig) oneFollower() error {
	followers := 0
	for _, in := range r.ins {
		body, err := get(in.MetricsURL())
		if err != nil {
			return err
		}
		if v, _ := metricValue(body, `coredns_pgcluster_relay_role{role="follower",zone="`+Zone+`"}`); v == 1 {
			followers++
		}
	}
	if followers != 1 {
		return fmt.Errorf("%d instances follow the registry, want 1", followers)
	}
	return nil
}

// attack runs one attack as a subtest on the rig, then undoes it: the
// attacker's keys gone with everything else in Redis (the fleet rewrites
// what is its own, as after a Redis restart without persistence), the
// backends listening and the registry's nodes healthy again. A fleet that
// does not recover from that, or that failed the attack, is replaced by
// new instances for the next attack, so that each attack is judged on its
// own.
func (r *redisRig) attack(name string, run func(t *testing.T, a *attackRun)) {
	r.t.Helper()
	if r.restart {
		r.replace()
	}
	ran := false // not when -run leaves it out
	ok := r.t.Run(name, func(t *testing.T) {
		ran = true
		a := &attackRun{rig: r, t: t, start: time.Now(), marks: logMarks(r.ins)}
		// Also when the attack failed: the log is part of what it shows.
		defer func() { a.logBounded(r.ins, a.marks) }()
		run(t, a)
	})
	if !ran {
		return
	}
	r.undo()
	if err := r.steady(); err != nil {
		r.t.Errorf("after the attack %q was undone, the fleet is not steady: %v", name, err)
		r.restart = true
	}
	if !ok {
		r.restart = true
	}
}

// undo removes what the attacks wrote and left.
func (r *redisRig) undo() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.rdb.FlushAll(ctx).Err(); err != nil {
		r.t.Fatalf("FLUSHALL: %v", err)
	}
	for _, b := range r.backends {
		if b.Closed() {
			b.Open(r.t)
		}
	}
	r.pg.MustExec(r.t, "UPDATE pgcluster_nodes SET healthy = true WHERE NOT healthy")
}

// replace stops the rig's instances and starts new ones.
func (r *redisRig) replace() {
	r.t.Helper()
	r.t.Logf("the last attack left the fleet broken: starting %d new instances", attackInstances)
	for _, in := range r.ins {
		if err := in.Term(); err != nil {
			r.t.Errorf("stopping a rig instance: %v", err)
		}
	}
	if err := r.rdb.FlushAll(context.Background()).Err(); err != nil {
		r.t.Fatalf("FLUSHALL: %v", err)
	}
	r.ins = startTogether(r.t, r.corefile, attackInstances)
	if err := r.steady(); err != nil {
		r.t.Fatalf("new instances are not steady: %v", err)
	}
	r.restart = false
}

// attackRun is one attack on the rig.
type attackRun struct {
	rig   *redisRig
	t     *testing.T
	start time.Time
	marks []int
}

// ctx is a context for the attacker's Redis calls.
func (a *attackRun) ctx() context.Context { return Ctx(a.t) }

// do runs one attacker's command, failing the test when Redis refuses it.
func (a *attackRun) do(args ...any) {
	a.t.Helper()
	if err := a.rig.rdb.Do(a.ctx(), args...).Err(); err != nil && !errors.Is(err, redis.Nil) {
		a.t.Fatalf("the attacker's %v: %v", args, err)
	}
}

// repeat runs write every period until the returned function is called
// or the attack ends, as an attacker that keeps at it; errors are ignored
// (the fleet's writes race it).
func (a *attackRun) repeat(period time.Duration, write func(ctx context.Context, i int)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for i := 0; ; i++ {
			write(ctx, i)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	})
	stop = sync.OnceFunc(func() {
		cancel()
		wg.Wait()
	})
	a.t.Cleanup(stop)
	return stop
}

// stop closes backend i and checks that it leaves every answer within the
// bound; see leaves.
func (a *attackRun) stop(i int) {
	a.t.Helper()
	a.leaves(fmt.Sprintf("backend n%d stopped", i), i, func() { a.rig.backends[i].Close() })
}

// unhealthy marks node i unhealthy in the registry and checks that it
// leaves every answer within the bound; see leaves.
func (a *attackRun) unhealthy(i int) {
	a.t.Helper()
	a.leaves(fmt.Sprintf("node n%d marked healthy=false in the registry", i), i, func() {
		a.rig.pg.MustExec(a.t, fmt.Sprintf("UPDATE pgcluster_nodes SET healthy = false WHERE name = 'n%d'", i))
	})
}

// leaves does what takes node i out (act) while asking every instance
// for local. every attackPoll, and fails the test unless every instance's
// last answer holding the node came within attackBound + attackMargin of
// act and the node then stayed out for attackHold, or on any answer other
// than NOERROR. It then checks that pgclusterctl status agrees with the
// instances. It logs how long each instance took.
func (a *attackRun) leaves(what string, i int, act func()) {
	a.t.Helper()
	host := attackHosts[i]
	ins := a.rig.ins
	type seen struct {
		lastHeld, lastAnswer time.Time
		answered             bool
		bad                  []string
	}
	var mu sync.Mutex
	got := make([]seen, len(ins))
	quit := make(chan struct{})
	var wg sync.WaitGroup
	for k, in := range ins {
		wg.Go(func() {
			for {
				select {
				case <-quit:
					return
				default:
				}
				m, err := Exchange("udp", in.Addr(), "local."+Zone, dns.TypeA)
				now := time.Now()
				mu.Lock()
				switch {
				case err != nil:
					// A lost datagram on a loaded machine: asked again.
				case m.Rcode != dns.RcodeSuccess:
					if len(got[k].bad) < 5 {
						got[k].bad = append(got[k].bad, now.Format("15:04:05.000")+" "+dns.RcodeToString[m.Rcode])
					}
				default:
					got[k].answered, got[k].lastAnswer = true, now
					if slices.Contains(Addrs(m), host) {
						got[k].lastHeld = now
					}
				}
				mu.Unlock()
				time.Sleep(attackPoll)
			}
		})
	}
	time.Sleep(5 * attackPoll) // the pollers ask before the change
	act()
	at := time.Now()
	limit := attackBound + attackMargin
	for {
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		gone := true
		for _, s := range got {
			from := at
			if s.lastHeld.After(at) {
				from = s.lastHeld
			}
			if !s.answered || !s.lastHeld.Before(s.lastAnswer) || s.lastAnswer.Sub(from) < attackHold {
				gone = false
			}
		}
		mu.Unlock()
		if gone || time.Since(at) > limit+attackHold {
			break
		}
	}
	close(quit)
	wg.Wait()
	var took []string
	slowest := time.Duration(0)
	for k, s := range got {
		d := max(s.lastHeld.Sub(at), 0)
		slowest = max(slowest, d)
		took = append(took, d.Round(time.Millisecond).String())
		switch {
		case len(s.bad) > 0:
			a.t.Errorf("%s: %s answered local. with %v", what, ins[k].Addr(), s.bad)
		case !s.answered:
			a.t.Errorf("%s: %s did not answer local. at all", what, ins[k].Addr())
		case !s.lastHeld.Before(s.lastAnswer):
			a.t.Errorf("%s: %s still answers %s %v later (bound %v + margin %v)", what, ins[k].Addr(), host, s.lastHeld.Sub(at).Round(time.Millisecond), attackBound, attackMargin)
		case d > limit:
			a.t.Errorf("%s: %s answered %s until %v later (bound %v + margin %v)", what, ins[k].Addr(), host, d.Round(time.Millisecond), attackBound, attackMargin)
		}
	}
	a.t.Logf("%s: gone from every instance's answers within %v (each: %s; bound %v)", what, slowest.Round(time.Millisecond), strings.Join(took, " "), attackBound)
	if a.t.Failed() {
		a.t.FailNow()
	}
	a.agrees()
}

// newcomer starts a fifth instance while the attack goes on and checks
// that it answers within attackFirstAnswer of its start and, from its
// first answer and for two seconds, never answers the nodes nodes and
// never answers other than NOERROR; then stops it, and checks its log too.
func (a *attackRun) newcomer(nodes ...int) {
	a.t.Helper()
	var hosts []string
	for _, i := range nodes {
		hosts = append(hosts, attackHosts[i])
	}
	start := time.Now()
	in := StartFleetInstanceNoWait(a.t, a.rig.corefile)
	var first time.Time
	n, early := 0, 0
	for first.IsZero() || time.Since(first) < 2*time.Second {
		if first.IsZero() && time.Since(start) > attackFirstAnswer {
			a.t.Fatalf("an instance started under the attack did not answer local. within %v (%d SERVFAIL meanwhile)", attackFirstAnswer, early)
		}
		m, err := Exchange("udp", in.Addr(), "local."+Zone, dns.TypeA)
		switch {
		case err != nil:
			if in.Exited() {
				a.t.Fatalf("an instance started under the attack exited: %s", in.State())
			}
			time.Sleep(5 * time.Millisecond)
			continue
		case first.IsZero() && m.Rcode == dns.RcodeServerFailure:
			// Listening before its first zone is made: not an answer yet.
			early++
			time.Sleep(5 * time.Millisecond)
			continue
		case first.IsZero():
			first = time.Now()
		}
		n++
		if m.Rcode != dns.RcodeSuccess {
			a.t.Fatalf("answer %d of an instance started under the attack (%v after its start): %s", n, time.Since(start).Round(time.Millisecond), dns.RcodeToString[m.Rcode])
		}
		for _, h := range hosts {
			if slices.Contains(Addrs(m), h) {
				a.t.Fatalf("answer %d of an instance started under the attack (%v after its start) holds %s: %v", n, time.Since(start).Round(time.Millisecond), h, Addrs(m))
			}
		}
		time.Sleep(attackPoll)
	}
	a.t.Logf("an instance started under the attack answered %d times from %v after its start (%d SERVFAIL before), never %v", n, first.Sub(start).Round(time.Millisecond), early, hosts)
	if err := in.Term(); err != nil {
		a.t.Error(err)
	}
	a.logBounded([]*Instance{in}, []int{0})
}

// attackFirstAnswer bounds how long an instance started under an attack
// may take to answer: a loaded machine starting a -race build, and the
// start-up wait for the registry (5 s).
const attackFirstAnswer = 15 * time.Second

// ctlNode is a node as pgclusterctl status -json reports it.
type ctlNode struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	Check   string `json:"check"`
	State   string `json:"state"`
	Reason  string `json:"reason"`
	// StatusError says why the stored status was not used.
	StatusError string `json:"status_error"`
}

// ctlReport is pgclusterctl status -json's report, what the tests read.
type ctlReport struct {
	Fleet *struct {
		Members []string `json:"members"`
	} `json:"fleet"`
	Clusters []struct {
		Name  string    `json:"name"`
		Nodes []ctlNode `json:"nodes"`
	} `json:"clusters"`
}

// ctlStatus runs bin/pgclusterctl status -json on the rig's registry and
// Redis, with its secret, and returns its report.
func (r *redisRig) ctlStatus(t testing.TB, dsn string) (ctlReport, error) {
	bin := pgclusterctlBuild.Binary(t)
	cmd := exec.Command(bin, "status", "-postgres", dsn, "-redis", r.rs.URL(), "-allow-loopback", "-json",
		"-check-interval", attackInterval.String(), "-check-timeout", attackTimeout.String())
	cmd.Env = append(os.Environ(), "PGCLUSTER_REDIS_SECRET="+r.secret)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var rep ctlReport
	if code := cmd.ProcessState.ExitCode(); code != 0 && code != 1 {
		return rep, fmt.Errorf("pgclusterctl status: %v (exit %d): %s", err, code, stderr.String())
	}
	if err := json.Unmarshal(out, &rep); err != nil {
		return rep, fmt.Errorf("pgclusterctl status -json: %v\n%s", err, out)
	}
	return rep, nil
}

// agrees checks that pgclusterctl status says of each of cluster local's
// nodes what every instance answers (see ctlAgrees), and logs the nodes it
// cannot tell.
func (a *attackRun) agrees() {
	a.t.Helper()
	var rep ctlReport
	err := pgtest.WaitFor(10*time.Second, func() error {
		want, err := answers(a.rig.ins[0])
		if err != nil {
			return err
		}
		if err := answersExactly(a.rig.ins, want)(); err != nil {
			return err
		}
		if rep, err = a.rig.ctlStatus(a.t, a.rig.pg.DSN("")); err != nil {
			return err
		}
		return ctlAgrees(rep, want)
	})
	if err != nil {
		a.t.Fatalf("pgclusterctl status does not agree with the answers: %v", err)
	}
	for _, c := range rep.Clusters {
		for _, n := range c.Nodes {
			if n.State == "unknown" {
				a.t.Logf("pgclusterctl status: %s/%s unknown (%s): %s", c.Name, n.Name, n.Reason, n.StatusError)
			}
		}
	}
}

// ctlAgrees returns an error unless the report has each of cluster
// local's nodes in exactly when its address is in answered. A node may be
// unknown (check_stale) instead: its stored check does not count (too old,
// or by an instance that no longer holds it), and the instances answer it
// as their own probes find it, which pgclusterctl cannot tell. It must
// never say in of a node the instances leave out, nor out of one they
// answer.
func ctlAgrees(rep ctlReport, answered []string) error {
	n := 0
	for _, c := range rep.Clusters {
		if c.Name != "local" {
			continue
		}
		for _, node := range c.Nodes {
			n++
			host := node.Address
			if h, _, ok := strings.Cut(host, ":"); ok {
				host = h
			}
			want := "out"
			if slices.Contains(answered, host) {
				want = "in"
			}
			if node.State != want && (node.State != "unknown" || node.Reason != "check_stale") {
				return fmt.Errorf("pgclusterctl says %s (%s) is %s (%s, check %q, status error %q); the instances answer %v",
					node.Name, node.Address, node.State, node.Reason, node.Check, node.StatusError, answered)
			}
		}
	}
	if n != len(attackHosts) {
		return fmt.Errorf("pgclusterctl reports %d nodes of cluster local, want %d", n, len(attackHosts))
	}
	return nil
}

// pgclusterctlBuild is cmd/pgclusterctl, built once per test run, with the
// race detector as bin/coredns is; TestMain removes it.
var pgclusterctlBuild = coretest.Build{Packages: []string{coretest.Pgclusterctl}, Race: raceEnabled}

// logMarks returns where each instance's log is now.
func logMarks(ins []*Instance) []int {
	marks := make([]int, len(ins))
	for i, in := range ins {
		marks[i] = len(in.Log())
	}
	return marks
}

// logBounded checks that, since marks, no instance wrote more than one
// line of a kind per minute of the attack (plus the one the attack's start
// may have begun): whoever writes into Redis must not be able to flood
// the fleet's logs. A kind is a line with its numbers, addresses, times
// and tokens blanked.
func (a *attackRun) logBounded(ins []*Instance, marks []int) {
	a.t.Helper()
	allowed := 1 + int(time.Since(a.start)/time.Minute)
	for i, in := range ins {
		lines := strings.Split(in.Log()[marks[i]:], "\n")
		kinds := map[string][]string{}
		total := 0
		for _, l := range lines {
			if strings.TrimSpace(l) == "" {
				continue
			}
			total++
			k := logKind(l)
			kinds[k] = append(kinds[k], l)
		}
		var over []string
		for _, k := range slices.Sorted(maps.Keys(kinds)) {
			if n := len(kinds[k]); n > allowed {
				over = append(over, fmt.Sprintf("%d× %q", n, kinds[k][0]))
			}
		}
		a.t.Logf("%s: %d log lines of %d kinds during the attack (%v)", in.Addr(), total, len(kinds), time.Since(a.start).Round(time.Second))
		if len(over) > 0 {
			a.t.Errorf("%s logged more than %d line(s) of a kind during the attack (%v): %s", in.Addr(), allowed, time.Since(a.start).Round(time.Second), strings.Join(over[:min(len(over), 5)], "; "))
		}
	}
}

// logWord is a run of letters and digits in a log line.
var logWord = regexp.MustCompile(`[A-Za-z0-9]+`)

// logKind is a log line with what varies between two lines of one kind
// blanked: a word that starts with a digit (numbers, addresses, times,
// durations) and a long hexadecimal word (a token, a digest). A name such
// as n1 stays.
func logKind(line string) string {
	return logWord.ReplaceAllStringFunc(line, func(w string) string {
		switch {
		case w[0] >= '0' && w[0] <= '9':
			return "#"
		case len(w) >= 8 && isHex(w):
			return "H"
		}
		return w
	})
}

func isHex(w string) bool {
	digit := false
	for _, c := range w {
		switch {
		case c >= '0' && c <= '9':
			digit = true
		case c >= 'a' && c <= 'f':
		default:
			return false
		}
	}
	return digit
}

// vmKB reads a field of /proc/PID/status (VmRSS, VmHWM), in kB.
func vmKB(pid int, field string) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for l := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			return strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}
