package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// The chaos run with check postgres (CHAOS_CHECK=postgres): the fleet
// checks every node with check postgres, its role sessions on (the
// default role_interval), so that the fast path, a promotion published at
// once and a server that says it is shutting down leaving at once, runs
// under the same faults and load as check tcp does. Cluster pgc is two
// real PostgreSQL servers in streaming replication, and a role swap is a
// planned switchover of them (switchover_rig_test.go's nodes and their
// rebuild); the four nodes of cluster local are chaosBackends forwarding
// to a third server, a standby, so that each probe and each role session
// is a real PostgreSQL session, and a flap closes the listener and every
// session through it, as a host going down does.

// chaosPGHosts are cluster pgc's servers, one address each, and
// chaosPGLocalHost the standby the nodes of cluster local forward to:
// addresses no other test uses.
var (
	chaosPGHosts     = [2]string{"127.0.0.171", "127.0.0.172"}
	chaosPGLocalHost = "127.0.0.173"
)

// chaosPGCheck is the check line's argument with check postgres: the test
// servers trust every loopback connection.
const chaosPGCheck = `postgres "user=postgres dbname=postgres sslmode=disable"`

// chaosCheckMode reads CHAOS_CHECK: tcp (the default) or postgres.
func chaosCheckMode(t *testing.T) string {
	t.Helper()
	switch v := os.Getenv("CHAOS_CHECK"); v {
	case "", "tcp":
		return "tcp"
	case "postgres":
		return v
	default:
		t.Fatalf("CHAOS_CHECK=%q: give tcp (the default) or postgres", v)
		return ""
	}
}

// chaosPGC is cluster pgc with check postgres, what its switchovers
// measured, and the standby behind cluster local.
type chaosPGC struct {
	// rig holds the servers: nodes 0 and 1 are cluster pgc's (p1, p2),
	// node 2 the standby the local nodes forward to; rig.primary is pgc's
	// primary of record.
	rig         *switchoverRig
	book        *chaosPGRoles
	switchovers []chaosSwitchover
}

// chaosSwitchover is what one planned switchover took.
type chaosSwitchover struct {
	// sessions is how many role sessions the fleet held as it began (one
	// per node is the design: 6, fewer for a local node down or just
	// back, or after an instance's restart).
	sessions int
	// stop is pg_ctl stop -m fast of the primary, promote pg_ctl promote
	// -w of the standby, rebuild the old primary's remaking as a standby.
	stop, promote, rebuild time.Duration
	// answered is from the promotion (promote -w returned) until every
	// instance answered the promoted node alone in primary.; standby from
	// the rebuilt server's start until every instance answered it in
	// standby.
	answered, standby time.Duration
}

// startChaosPGC starts cluster pgc's primary, its standby and the local
// nodes' standby (of the same primary), each on its own address; they are
// stopped when the test ends, after the instances.
func startChaosPGC(t *testing.T) *chaosPGC {
	rig := &switchoverRig{}
	t.Cleanup(rig.close)
	p1, err := pgtest.Start(pgtest.Options{Host: chaosPGHosts[0], Settings: switchoverSettings("p1")})
	if err != nil {
		t.Fatalf("CHAOS_CHECK=postgres needs real PostgreSQL servers and could not start one: %v", err)
	}
	rig.nodes[0] = &switchoverNode{name: "p1", host: p1.Host, port: p1.Port, pg: p1}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, n := range []struct{ name, host string }{{"p2", chaosPGHosts[1]}, {"pgl", chaosPGLocalHost}} {
		wg.Go(func() {
			pg, err := pgtest.StartStandby(p1, pgtest.Options{Host: n.host, Settings: switchoverSettings(n.name)})
			if err != nil {
				errs[i] = err
				return
			}
			rig.nodes[i+1] = &switchoverNode{name: n.name, host: pg.Host, port: pg.Port, pg: pg}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("CHAOS_CHECK=postgres could not make its standbys: %v", err)
	}
	now := time.Now()
	book := &chaosPGRoles{}
	for i, role := range []string{"primary", "standby"} {
		book.begin(rig.nodes[i].host, role, now)
		book.held(rig.nodes[i].host, role, now)
	}
	return &chaosPGC{rig: rig, book: book}
}

// localTarget is where the local nodes' backends forward to.
func (c *chaosPGC) localTarget() string { return c.rig.nodes[2].pg.HostPort() }

// primary returns pgc's primary of record.
func (c *chaosPGC) primary() *switchoverNode { return c.rig.nodes[c.rig.primary] }

// rows are cluster pgc's registry rows: p1 primary, p2 standby.
func (c *chaosPGC) rows() []string {
	var rows []string
	for i, n := range c.rig.nodes[:2] {
		role := []string{"primary", "standby"}[i]
		rows = append(rows, fmt.Sprintf("('pgc', '%s', '%s', %d, '%s')", n.name, n.host, n.port, role))
	}
	return rows
}

// switchover makes a planned switchover of cluster pgc, as an operator
// would: the primary stopped with pg_ctl stop -m fast (its sessions end
// with 57P01 and its WAL reaches the standby before it goes), the standby
// promoted at once. Once every instance answers the promoted node in
// primary., the registry's roles are updated to match (the operator's
// record; the checks decide the answers), and the old primary is rebuilt
// as a streaming standby of the new one at its address and port; the step
// ends when every instance answers it in standby. It returns how long
// after the registry's COMMIT every instance's TXT of the new primary
// said role=primary: the fleet follows the registry.
func (r *chaosRun) switchover() time.Duration {
	c := r.pgc
	rig := c.rig
	old, next := rig.nodes[rig.primary], rig.nodes[1-rig.primary]
	s := chaosSwitchover{sessions: rig.sessions()}
	r.event("switchover: %s (%s) stopped, %s (%s) promoted; the fleet holds %d role sessions", old.name, old.host, next.name, next.host, s.sessions)
	began := time.Now()
	c.book.switchFrom(began)
	if err := old.stopFast(); err != nil {
		r.t.Fatal(err)
	}
	stopped := time.Now()
	s.stop = stopped.Sub(began)
	c.book.end(old.host, "primary", began, stopped)
	c.book.begin(next.host, "primary", stopped)
	if err := next.pg.Promote(); err != nil {
		r.t.Fatal(err)
	}
	promoted := time.Now()
	s.promote = promoted.Sub(stopped)
	c.book.held(next.host, "primary", promoted)
	c.book.end(next.host, "standby", stopped, promoted)
	rig.primary = 1 - rig.primary
	Eventually(r.t, chaosStepTimeout, answersOnly(r.ins, chaosPrimary, next.host))
	s.answered = time.Since(promoted)
	c.book.switchTo(time.Now())

	followed := r.recordRoles(next, old)

	rebuilding := time.Now()
	c.book.begin(old.host, "standby", rebuilding)
	if err := rig.rebuild(old); err != nil {
		r.t.Fatal(err)
	}
	rebuilt := time.Now()
	c.book.held(old.host, "standby", rebuilt)
	s.rebuild = rebuilt.Sub(rebuilding)
	r.event("switchover: %s streams from %s", old.name, next.name)
	Eventually(r.t, chaosStepTimeout, answersOnly(r.ins, chaosStandby, old.host))
	s.standby = time.Since(rebuilt)
	c.switchovers = append(c.switchovers, s)
	return followed
}

// recordRoles writes the new roles into the registry once one instance
// follows it for the fleet (see swapAnswered), and returns how long
// after the COMMIT every instance's TXT of the new primary said
// role=primary.
func (r *chaosRun) recordRoles(primary, standby *switchoverNode) time.Duration {
	r.untilAll(time.Now(), registryUp, 1)
	r.followed(chaosPGFollowTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := r.pg.Exec(ctx, "UPDATE pgcluster_nodes SET role = CASE name WHEN $1 THEN 'primary' ELSE 'standby' END WHERE cluster = 'pgc' AND name IN ($1, $2)",
		primary.name, standby.name)
	if err != nil {
		r.t.Fatalf("record the new roles of cluster pgc: %v", err)
	}
	committed := time.Now()
	name := primary.name + ".pgc." + Zone
	Eventually(r.t, chaosPGFollowTimeout, func() error {
		for _, in := range r.ins {
			m, err := Exchange("udp", in.Addr(), name, dns.TypeTXT)
			if err != nil {
				return err
			}
			var txt []string
			for _, rr := range m.Answer {
				if t, ok := rr.(*dns.TXT); ok {
					txt = append(txt, t.Txt...)
				}
			}
			if !slices.Contains(txt, "role=primary") {
				return fmt.Errorf("%s: TXT %s says %v, want role=primary", in.Addr(), name, txt)
			}
		}
		return nil
	})
	return time.Since(committed)
}

// answersOnly checks that every instance answers name with host alone.
func answersOnly(ins []*Instance, name, host string) func() error {
	return func() error {
		for _, in := range ins {
			m, err := Exchange("udp", in.Addr(), name, dns.TypeA)
			if err != nil {
				return err
			}
			if got := Addrs(m); len(got) != 1 || got[0] != host {
				return fmt.Errorf("%s answers %v for %s, want %s", in.Addr(), got, name, host)
			}
		}
		return nil
	}
}

// chaosPGRoles is when each of cluster pgc's real servers held each role:
// primary from its promotion (or its start) until its stop; standby from
// its start as one until its promotion. A server stopped or being rebuilt
// holds none. Each change is known to a window, from just before the
// command that makes it to its return: an answer naming a node is judged
// against the widest spans (the node may have held the role then), an
// answer without an address against the narrowest (no node surely held it).
type chaosPGRoles struct {
	mu       sync.Mutex
	spans    []chaosRoleSpan
	switches []chaosSwitchSpan
}

type chaosRoleSpan struct {
	host, role string
	// since: it may hold the role from then; sure: it surely does (zero
	// until known). ends: it may have lost it from then; until: it surely
	// had (both zero while it holds the role).
	since, sure, ends, until time.Time
}

// chaosSwitchSpan is a planned switchover: from the primary's stop until
// every instance answered the promoted node (to zero meanwhile).
type chaosSwitchSpan struct{ from, to time.Time }

// begin records that host may hold role from since.
func (b *chaosPGRoles) begin(host, role string, since time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.spans = append(b.spans, chaosRoleSpan{host: host, role: role, since: since})
}

// held records that host surely holds role from at.
func (b *chaosPGRoles) held(host, role string, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.spans {
		if s := &b.spans[i]; s.host == host && s.role == role && s.until.IsZero() && s.sure.IsZero() {
			s.sure = at
		}
	}
}

// end records that host's hold of role ended between ends and until.
func (b *chaosPGRoles) end(host, role string, ends, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range b.spans {
		if s := &b.spans[i]; s.host == host && s.role == role && s.until.IsZero() {
			s.ends, s.until = ends, until
		}
	}
}

func (b *chaosPGRoles) switchFrom(at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.switches = append(b.switches, chaosSwitchSpan{from: at})
}

func (b *chaosPGRoles) switchTo(at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.switches[len(b.switches)-1].to = at
}

func (b *chaosPGRoles) holds(host, role string, from, to time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.spans {
		if s.host == host && s.role == role && !s.since.After(to) && (s.until.IsZero() || !s.until.Before(from)) {
			return true
		}
	}
	return false
}

// vacant walks [from, to] from its start through the spans of role that
// surely cover it, one after another: a moment none covers is a vacancy.
func (b *chaosPGRoles) vacant(role string, from, to time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	at := from
	for !at.After(to) {
		covered := false
		for _, s := range b.spans {
			if s.role != role || s.sure.IsZero() || s.sure.After(at) || (!s.ends.IsZero() && !s.ends.After(at)) {
				continue
			}
			if s.ends.IsZero() {
				return false
			}
			at, covered = s.ends, true
		}
		if !covered {
			return true
		}
	}
	return false
}

func (b *chaosPGRoles) switching(t time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, s := range b.switches {
		if !t.Before(s.from) && (s.to.IsZero() || !t.After(s.to)) {
			return true
		}
	}
	return false
}

// changes returns when each primary span ended (the old primary's stop
// returned), its host, and when that host was next promoted.
func (b *chaosPGRoles) changes() (at []time.Time, old []string, next []time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, s := range b.spans {
		if s.role != "primary" || s.until.IsZero() {
			continue
		}
		at = append(at, s.until)
		old = append(old, s.host)
		n := time.Time{}
		for _, l := range b.spans[i+1:] {
			if l.role == "primary" && l.host == s.host {
				n = l.since
				break
			}
		}
		next = append(next, n)
	}
	return at, old, next
}

// summary is the report's lines on the switchovers.
func (c *chaosPGC) summary() []string {
	if len(c.switchovers) == 0 {
		return []string{"switchovers: none"}
	}
	var stop, promote, answered, rebuild, standby []time.Duration
	var sessions []string
	for _, s := range c.switchovers {
		stop = append(stop, s.stop)
		promote = append(promote, s.promote)
		answered = append(answered, s.answered)
		rebuild = append(rebuild, s.rebuild)
		standby = append(standby, s.standby)
		sessions = append(sessions, fmt.Sprint(s.sessions))
	}
	for _, ds := range [][]time.Duration{stop, promote, answered, rebuild, standby} {
		slices.Sort(ds)
	}
	mm := func(ds []time.Duration) string {
		return fmt.Sprintf("median %v, max %v", quantile(ds, 0.5), quantile(ds, 1))
	}
	return []string{
		fmt.Sprintf("switchovers: %d (stop -m fast of the primary, promote -w of the standby, the old primary rebuilt as a standby); role sessions the fleet held as each began: %s",
			len(c.switchovers), strings.Join(sessions, " ")),
		fmt.Sprintf("  stop -m fast: %s; promote -w: %s; promotion → every instance answers the new primary alone: %s",
			mm(stop), mm(promote), mm(answered)),
		fmt.Sprintf("  rebuild: %s; rebuilt → every instance answers it in standby.: %s", mm(rebuild), mm(standby)),
	}
}

// TestChaosPGRoles checks the book the postgres chaos run judges role
// answers against, on one switchover: p1's stop from 9.9 s to 10 s, p2's
// promotion from 10 s to 11 s, p1's rebuild as a standby from 12 s to 13 s.
func TestChaosPGRoles(t *testing.T) {
	t0 := time.Now()
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	b := &chaosPGRoles{}
	for _, h := range []struct{ host, role string }{{"p1", "primary"}, {"p2", "standby"}} {
		b.begin(h.host, h.role, at(0))
		b.held(h.host, h.role, at(0))
	}
	b.switchFrom(at(9.9))
	b.end("p1", "primary", at(9.9), at(10))
	b.begin("p2", "primary", at(10))
	b.held("p2", "primary", at(11))
	b.end("p2", "standby", at(10), at(11))
	b.switchTo(at(11.5))
	b.begin("p1", "standby", at(12))
	b.held("p1", "standby", at(13))

	for _, c := range []struct {
		host, role string
		from, to   float64
		want       bool
	}{
		{"p1", "primary", 9, 9.5, true},
		{"p1", "primary", 10, 12, true}, // its last moment
		{"p1", "primary", 10.1, 12, false},
		{"p2", "primary", 5, 9.9, false},
		{"p2", "primary", 9, 10, true},
		{"p2", "standby", 11.1, 20, false},
		{"p1", "standby", 11, 11.9, false},
		{"p1", "standby", 12, 13, true},
	} {
		if got := b.holds(c.host, c.role, at(c.from), at(c.to)); got != c.want {
			t.Errorf("holds(%s, %s, %v s, %v s) = %v, want %v", c.host, c.role, c.from, c.to, got, c.want)
		}
	}
	for _, c := range []struct {
		role     string
		from, to float64
		want     bool
	}{
		{"primary", 0, 9.8, false},
		{"primary", 0, 20, true}, // from p1's stop to p2's promotion, none surely is
		{"primary", 11, 20, false},
		{"standby", 0, 9.9, false},
		{"standby", 0, 10, true}, // p2 may have left from 10 s, p1 surely is from 13 s
		{"standby", 12, 12.5, true},
		{"standby", 12.5, 13.5, true},
		{"standby", 13, 20, false},
	} {
		if got := b.vacant(c.role, at(c.from), at(c.to)); got != c.want {
			t.Errorf("vacant(%s, %v s, %v s) = %v, want %v", c.role, c.from, c.to, got, c.want)
		}
	}
	for _, c := range []struct {
		at   float64
		want bool
	}{{9.8, false}, {9.9, true}, {11.5, true}, {11.6, false}} {
		if got := b.switching(at(c.at)); got != c.want {
			t.Errorf("switching(%v s) = %v, want %v", c.at, got, c.want)
		}
	}
	when, old, next := b.changes()
	if len(when) != 1 || !when[0].Equal(at(10)) || old[0] != "p1" || !next[0].IsZero() {
		t.Errorf("changes() = %v %v %v, want p1 at 10 s, not primary again", when, old, next)
	}
}
