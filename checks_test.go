package pgcluster

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	dto "github.com/prometheus/client_model/go"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// checked builds testNodes with checks on and the verdicts in view.
func checked(check string, view health.View, opts ...func(*settings)) *PgCluster {
	set := &settings{zones: []string{testZone}, ttl: 5, check: check, allDown: allDownOpen}
	for _, o := range opts {
		o(set)
	}
	return newTestPlugin(buildInput{settings: set, nodes: testNodes(), view: view})
}

func up(role string, wal uint64) health.Verdict {
	return health.Verdict{State: health.Up, Role: role, WAL: wal, Cause: "ok", Last: time.Unix(1700000000, 0)}
}

func down(cause string) health.Verdict {
	return health.Verdict{State: health.Down, Cause: cause, Detail: "connect: connection refused"}
}

func addrs(t *testing.T, p *PgCluster, name string) string {
	t.Helper()
	a := Addrs(query(t, p, name+testZone, dns.TypeA))
	sort.Strings(a)
	return strings.Join(a, " ")
}

// A node whose check fails leaves every answer, with the check's cause as
// the reason; a node not checked yet keeps the registry's judgement.
func TestCheckDownLeaves(t *testing.T) {
	p := checked(checkTCP, health.ViewOf(map[string]health.Verdict{"local/pg1": down("refused"), "local/pg2": {State: health.Up, Cause: "ok"}}),
		func(s *settings) { s.allDown = allDownClosed })
	if got := addrs(t, p, "local."); got != "192.0.2.2" {
		t.Errorf("local.: %q, want pg2 only (pg1 down)", got)
	}
	if got := addrs(t, p, "primary.local."); got != "" {
		t.Errorf("primary.: %q, want none: the primary is down (all_down closed)", got)
	}
	txt := query(t, p, "pg1.local."+testZone, dns.TypeTXT).Answer[0].String()
	for _, want := range []string{`"state=out"`, `"reason=check_refused"`, `"check=tcp down"`, `"check_cause=refused"`, "connection refused"} {
		if !strings.Contains(txt, want) {
			t.Errorf("pg1 TXT lacks %s: %s", want, txt)
		}
	}
	// pg3 (IPv6) is not checked yet: it serves on the registry's word.
	if txt := query(t, p, "pg3.local."+testZone, dns.TypeTXT).Answer[0].String(); !strings.Contains(txt, `"state=in"`) || !strings.Contains(txt, `"check=tcp unknown"`) {
		t.Errorf("pg3 TXT: %s", txt)
	}
}

// With check postgres the role read from PostgreSQL decides primary. and
// standby., whatever the registry's role column says.
func TestCheckRoleWins(t *testing.T) {
	p := checked(checkPostgres, health.ViewOf(map[string]health.Verdict{"local/pg1": up("standby", 100), "local/pg2": up("primary", 100), "local/pg3": up("standby", 100)}))
	if got := addrs(t, p, "primary.local."); got != "192.0.2.2" {
		t.Errorf("primary.: %q, want pg2, which the check reads as primary", got)
	}
	if got := addrs(t, p, "standby.local."); got != "192.0.2.1" {
		t.Errorf("standby.: %q, want pg1", got)
	}
	txt := query(t, p, "pg2.local."+testZone, dns.TypeTXT).Answer[0].String()
	for _, want := range []string{`"role=primary"`, `"check=postgres up"`, `"check_role=primary"`, `"checked=2023-11-14T22:13:20Z"`} {
		if !strings.Contains(txt, want) {
			t.Errorf("pg2 TXT lacks %s: %s", want, txt)
		}
	}
}

// Split brain: while two serving nodes report being primary, primary. has
// no address (no fail-open either); the cluster name and standby. answer.
func TestCheckSplitBrain(t *testing.T) {
	p := checked(checkPostgres, health.ViewOf(map[string]health.Verdict{"local/pg1": up("primary", 100), "local/pg2": up("primary", 90), "local/pg3": up("standby", 80)}))
	r := query(t, p, "primary.local."+testZone, dns.TypeA)
	if len(r.Answer) != 0 || r.Rcode != dns.RcodeSuccess || len(r.Ns) != 1 {
		t.Errorf("primary. in split brain: want NODATA with the SOA, got %v", r)
	}
	if got := addrs(t, p, "local."); got != "192.0.2.1 192.0.2.2" {
		t.Errorf("local.: %q", got)
	}
	if st := p.snapshot().clusters["local"].stat; len(st.primaries) != 2 {
		t.Errorf("primaries %v", st.primaries)
	}
}

// max_lag: a standby further behind the primary's WAL leaves standby. and
// prefer-standby., stays in the cluster name; the lag number is in TXT
// only, never in the content hash.
func TestCheckMaxLag(t *testing.T) {
	lagged := func(standbyWAL uint64) *PgCluster {
		return checked(checkPostgres, health.ViewOf(map[string]health.Verdict{"local/pg1": up("primary", 1000), "local/pg2": up("standby", standbyWAL), "local/pg3": up("standby", standbyWAL)}),
			func(s *settings) { s.maxLag = 100 })
	}
	p := lagged(950)
	if got := addrs(t, p, "standby.local."); got != "192.0.2.2" {
		t.Errorf("50 bytes behind, max_lag 100: standby. %q", got)
	}
	hashNear := p.snapshot().hash
	if p2 := lagged(960); p2.snapshot().hash != hashNear {
		t.Error("a WAL position alone changed the content hash")
	}
	p = lagged(800)
	if got := addrs(t, p, "standby.local."); got != "" {
		t.Errorf("200 bytes behind, max_lag 100: standby. %q, want none", got)
	}
	if got := addrs(t, p, "prefer-standby.local."); got != "192.0.2.1" {
		t.Errorf("prefer-standby. with its only standby lagging: %q, want the primary", got)
	}
	if got := addrs(t, p, "local."); got != "192.0.2.1 192.0.2.2" {
		t.Errorf("a lagging standby stays in local.: %q", got)
	}
	if txt := query(t, p, "pg2.local."+testZone, dns.TypeTXT).Answer[0].String(); !strings.Contains(txt, "lag=200 bytes, over max_lag 100") {
		t.Errorf("TXT: %s", txt)
	}
	if v := p.snapshot().verdict("local/pg2"); !strings.Contains(v, "lagging") {
		t.Errorf("verdict %q", v)
	}
}

// All nodes down: all_down open answers them anyway, counted; closed
// answers NODATA with the SOA. A node the registry marks unhealthy is never
// answered.
func TestCheckAllDown(t *testing.T) {
	view := health.ViewOf(map[string]health.Verdict{"local/pg1": down("refused"), "local/pg2": down("timeout"), "local/pg3": down("refused"), "local/pg4": down("refused")})
	p := checked(checkTCP, view)
	if got := addrs(t, p, "local."); got != "192.0.2.1 192.0.2.2" {
		t.Errorf("fail-open local.: %q, want pg1 pg2 (pg4 is unhealthy in the registry)", got)
	}
	if got := addrs(t, p, "primary.local."); got != "192.0.2.1" {
		t.Errorf("fail-open primary.: %q", got)
	}
	if got := addrs(t, p, "standby.local."); got != "192.0.2.2" {
		t.Errorf("fail-open standby.: %q", got)
	}
	if n := p.snapshot().failOpen; n == 0 {
		t.Error("fail-open sets not counted")
	}
	p = checked(checkTCP, view, func(s *settings) { s.allDown = allDownClosed })
	r := query(t, p, "local."+testZone, dns.TypeA)
	if len(r.Answer) != 0 || r.Rcode != dns.RcodeSuccess || len(r.Ns) != 1 {
		t.Errorf("all_down closed: want NODATA with the SOA, got %v", r)
	}
	// One node up: no fail-open.
	e := view.Edit()
	e.Set("local/pg2", up("", 0))
	view = e.View()
	p = checked(checkTCP, view)
	if got := addrs(t, p, "local."); got != "192.0.2.2" {
		t.Errorf("one node up: %q", got)
	}
	if got := addrs(t, p, "primary.local."); got != "192.0.2.1" {
		t.Errorf("primary. down while pg2 serves: fail-open to pg1, got %q", got)
	}
}

// Checks off: the view is ignored and no target is made.
func TestChecksOffNoTargets(t *testing.T) {
	p := newTestPlugin(buildInput{nodes: testNodes(), view: health.ViewOf(map[string]health.Verdict{"local/pg1": down("refused")})})
	if got := addrs(t, p, "primary.local."); got != "192.0.2.1" {
		t.Errorf("checks off: %q", got)
	}
	if n := len(p.snapshot().targets); n != 0 {
		t.Errorf("%d targets with checks off", n)
	}
	p = checked(checkTCP, health.View{})
	var keys []string
	for _, tg := range p.snapshot().targets {
		keys = append(keys, tg.Key+"="+tg.Addr.String())
	}
	// pg4, which the registry marks unhealthy, is not checked.
	if got := strings.Join(keys, " "); got != "local/pg1=192.0.2.1:5432 local/pg2=192.0.2.2:5432 local/pg3=[2001:db8::3]:5433 other/x1=192.0.2.21:5432" {
		t.Errorf("targets: %s", got)
	}
}

// countingListener is a node's port, probed by check tcp: it accepts
// connections, closes them, and counts them (coretest.Backend).
type countingListener struct{ *coretest.Backend }

func listenCounting(t *testing.T) *countingListener {
	t.Helper()
	return &countingListener{coretest.NewBackend(t, "127.0.0.1")}
}

func (c *countingListener) node(name string, healthy bool) Node {
	ap := netip.MustParseAddrPort(c.Addr())
	return Node{Cluster: "local", Name: name, Address: ap.Addr(), Port: int(ap.Port()), Role: roleStandby, Healthy: healthy}
}

// Only nodes the registry allows are checked: no probe reaches a node the
// registry marks healthy=false, while its healthy neighbour is probed every
// interval; marked healthy, it is probed; marked unhealthy again, its
// probes stop.
func TestUnhealthyNotProbed(t *testing.T) {
	ok, sick := listenCounting(t), listenCounting(t)
	set := &settings{zones: []string{testZone}, ttl: 5, dsn: "unhealthy-not-probed", check: checkTCP,
		interval: 100 * time.Millisecond, timeout: 50 * time.Millisecond, rise: 1, fall: 1, allowLoopback: true, allDown: allDownClosed}
	pb := runChecks(t, set)
	probed := func(c *countingListener, n int64) error {
		return pgtest.WaitFor(5*time.Second, func() error {
			if got := c.Accepts(); got < n {
				return fmt.Errorf("%d probes, want %d", got, n)
			}
			return nil
		})
	}

	pb.apply([]Node{ok.node("ok", true), sick.node("sick", false)}, nil)
	if err := probed(ok, 5); err != nil {
		t.Fatalf("the healthy node: %v", err)
	}
	if n := sick.Accepts(); n != 0 {
		t.Errorf("the node the registry marks unhealthy was probed %d times while the healthy one was probed 5", n)
	}

	pb.apply([]Node{ok.node("ok", true), sick.node("sick", true)}, nil)
	if err := probed(sick, 2); err != nil {
		t.Fatalf("marked healthy: %v", err)
	}

	pb.apply([]Node{ok.node("ok", true), sick.node("sick", false)}, nil)
	// A probe in flight when the targets change may still land.
	before := sick.Accepts() + 1
	okBefore := ok.Accepts()
	if err := probed(ok, okBefore+5); err != nil {
		t.Fatalf("the healthy node: %v", err)
	}
	if n := sick.Accepts(); n > before {
		t.Errorf("marked unhealthy again: probed %d more times while the healthy node was probed 5", n-before+1)
	}
}

// probe_budget bounds the probes an instance starts: 10 nodes at an
// interval of 100 ms ask for 100 probes a second; with probe_budget 10
// their listeners see about 10 a second, every node in turn, and each probe
// that waited counts in coredns_pgcluster_probes_delayed_total.
func TestCheckProbeBudget(t *testing.T) {
	const budget, nodes = 10, 10
	var (
		ls []*countingListener
		ns []Node
	)
	for i := range nodes {
		l := listenCounting(t)
		ls = append(ls, l)
		ns = append(ns, l.node(fmt.Sprintf("n%d", i), true))
	}
	set := &settings{zones: []string{testZone}, ttl: 5, dsn: "probe-budget", check: checkTCP, interval: 100 * time.Millisecond,
		timeout: 50 * time.Millisecond, rise: 1, fall: 1, allowLoopback: true, allDown: allDownClosed, probeBudget: budget}
	delayed := func() float64 {
		var m dto.Metric
		if err := probesDelayed.WithLabelValues(testZone).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetCounter().GetValue()
	}
	before := delayed()
	pb := runChecks(t, set)
	total := func() (n int64) {
		for _, l := range ls {
			n += l.Accepts()
		}
		return n
	}
	began := time.Now()
	pb.apply(ns, nil)
	if err := pgtest.WaitFor(10*time.Second, func() error {
		if n := total(); n < 3*nodes {
			return fmt.Errorf("%d probes", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	n := total()
	// One token at start (50 ms of 10 a second is under one), and one
	// probe's connection counted late or early.
	limit := budget*took.Seconds() + 2
	t.Logf("%d probes in %v (%.1f/s; the nodes ask for %d/s), %v waited for probe_budget %d", n, took.Round(time.Millisecond),
		float64(n)/took.Seconds(), nodes*10, delayed()-before, budget)
	if float64(n) > limit {
		t.Errorf("%d probes in %v, over probe_budget %d a second (%.0f)", n, took, budget, limit)
	}
	for i, l := range ls {
		if l.Accepts() < 2 {
			t.Errorf("node n%d probed %d times of %d: the nodes are not probed in turn", i, l.Accepts(), n)
		}
	}
	if delayed()-before < 1 {
		t.Error("no probe counted in probes_delayed_total, though the nodes ask for ten times the budget")
	}
}

// runChecks starts set's checks on a publisher of their own until the test
// ends, and returns the publisher.
func runChecks(t *testing.T, set *settings) *publisher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pb, _, done, err := startPublisher(ctx, set)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		if done != nil {
			<-done
		}
	})
	return pb
}

// The targets gauge counted from a View's changes alone agrees with a
// count of every verdict, through Edits, folds and whole Views.
func TestViewCountsFollowEdits(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var vc viewCounts
	v := health.View{}
	for step := range 2000 {
		if step%500 == 499 {
			v = health.ViewOf(maps.Collect(v.All())) // made whole
		} else {
			e := v.Edit()
			for range 1 + rng.IntN(5) {
				k := fmt.Sprintf("c/n%d", rng.IntN(300))
				if rng.IntN(5) == 0 {
					e.Delete(k)
				} else {
					e.Set(k, health.Verdict{State: health.State(1 + rng.IntN(2))})
				}
			}
			v = e.View()
		}
		vc.report("pgcluster.test.", v)
		want := map[health.State]int{}
		for _, x := range v.All() {
			want[x.State]++
		}
		for _, st := range []health.State{health.Up, health.Down} {
			if vc.counts[st] != want[st] {
				t.Fatalf("step %d: %v counted %d from the changes, %d in the View", step, st, vc.counts[st], want[st])
			}
		}
	}
}
