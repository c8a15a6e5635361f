package pgcluster

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/health"
)

// drainFleet is the relay rig's follower and reader, and an instance that
// reads PostgreSQL itself without the relay: what a drain does must reach
// all three.
func drainFleet(t *testing.T) (*relayRig, []*relayInstance) {
	t.Helper()
	g := newRelayRig(t)
	g.fleet(2)
	set := &settings{dsn: g.pg.DSN(""), zones: []string{testZone}, ttl: 5, refresh: time.Hour}
	p := &PgCluster{Zones: set.zones, ttl: set.ttl, Next: test.ErrorHandler()}
	pb := publisherFor(p, set)
	r := newRegistry(set, "", pb.applyAt)
	ctx, cancel := context.WithCancel(context.Background())
	go r.run(ctx)
	t.Cleanup(func() { cancel(); <-r.done })
	all := append(g.fleetNow(), &relayInstance{name: "instance without the relay", p: p})
	g.wait(10*time.Second, "every instance answers every node", func() error { return answersExactly(all, attackNodes) })
	return g, all
}

// askName asks p for name and qtype.
func askName(p *PgCluster, name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	code, _ := p.ServeDNS(context.Background(), rec, m)
	if rec.Msg == nil {
		return &dns.Msg{MsgHdr: dns.MsgHdr{Rcode: code}}
	}
	return rec.Msg
}

// namesAnswer checks that every instance answers each name's A query with
// exactly the addresses given (none: NODATA).
func namesAnswer(ins []*relayInstance, want map[string][]string) error {
	for _, in := range ins {
		for name, addrs := range want {
			m := askName(in.p, name+testZone, dns.TypeA)
			got := answerAddrs(m)
			slices.Sort(got)
			if m.Rcode != dns.RcodeSuccess || !slices.Equal(got, slices.Sorted(slices.Values(addrs))) {
				return fmt.Errorf("%s: %s answers %s %v, want %v", in.name, name, dns.RcodeToString[m.Rcode], got, addrs)
			}
		}
	}
	return nil
}

// servedTXT is the TXT strings p answers for name, joined.
func servedTXT(p *PgCluster, name string) string {
	var out []string
	for _, rr := range askName(p, name+testZone, dns.TypeTXT).Answer {
		if t, ok := rr.(*dns.TXT); ok {
			out = append(out, t.Txt...)
		}
	}
	return strings.Join(out, " ")
}

// A drain of a standby takes it out of every shared name on every
// instance (the relay's follower, its reader, and an instance without the
// relay) while its own name still answers and says why; it ends by itself
// at its "until", judged by PostgreSQL's clock, with nobody writing. A
// drain of a zone, of a whole cluster, one ended already and one matching
// no node do what they say; deleting a drain ends it.
func TestDrains(t *testing.T) {
	g, ins := drainFleet(t)
	const standbys, primary = "standby.local.", "primary.local."
	drained := map[string][]string{
		"local.": {"192.0.2.1", "192.0.2.3"}, "prod.": {"192.0.2.1", "192.0.2.3"},
		standbys: {"192.0.2.3"}, primary: {"192.0.2.1"}, "pg2.local.": {"192.0.2.2"},
	}
	const lasts = 3 * time.Second
	start := time.Now()
	g.pg.MustExec(t, fmt.Sprintf(`INSERT INTO pgcluster_drains (cluster, node, reason, until, created_by)
  VALUES ('LOCAL', 'pg2', 'reindex', now() + interval '%d seconds', 'alice')`, int(lasts.Seconds())))
	g.wait(10*time.Second, "pg2 drained everywhere", func() error { return namesAnswer(ins, drained) })
	t.Logf("drain → out of the shared names on all 3 instances: %v", time.Since(start).Round(time.Millisecond))
	for _, in := range ins {
		if txt := servedTXT(in.p, "pg2.local."); !strings.Contains(txt, "drained=reindex (until 20") || !strings.Contains(txt, "by alice") {
			t.Errorf("%s: pg2's TXT does not say it is drained: %s", in.name, txt)
		}
		if txt := servedTXT(in.p, "local."); !strings.Contains(txt, "drained=1") {
			t.Errorf("%s: the cluster's TXT does not count the drained node: %s", in.name, txt)
		}
	}
	all := map[string][]string{"local.": attackNodes, standbys: {"192.0.2.2", "192.0.2.3"}, primary: {"192.0.2.1"}}
	g.wait(lasts+10*time.Second, "the drain ended by itself", func() error { return namesAnswer(ins, all) })
	back := time.Since(start)
	t.Logf("drain for %v: back on all 3 instances %v after the insert", lasts, back.Round(time.Millisecond))
	if back < lasts-500*time.Millisecond {
		t.Fatalf("the drain of %v ended after %v", lasts, back)
	}

	// A drain ended already, and one that matches no node: nothing moves.
	g.pg.MustExec(t, `INSERT INTO pgcluster_drains (cluster, node, reason, until) VALUES ('local', 'pg3', 'over', now() - interval '1 second');
INSERT INTO pgcluster_drains (cluster, node, reason) VALUES ('local', 'pg9', 'no such node'), ('nowhere', NULL, 'no such cluster')`)
	// A marker change after them: once it shows, they were read.
	g.pg.MustExec(t, "INSERT INTO pgcluster_aliases VALUES ('marker', 'local')")
	g.wait(10*time.Second, "the marker", func() error { return namesAnswer(ins, map[string][]string{"marker.": attackNodes}) })
	if err := namesAnswer(ins, all); err != nil {
		t.Fatalf("a drain that matches nothing moved an answer: %v", err)
	}

	// Every node of a topology zone.
	g.pg.MustExec(t, "UPDATE pgcluster_nodes SET zone = CASE name WHEN 'pg1' THEN 'a' ELSE 'b' END")
	g.pg.MustExec(t, "INSERT INTO pgcluster_drains (cluster, zone, reason) VALUES ('local', 'B', 'zone b patching')")
	g.wait(10*time.Second, "zone b drained", func() error {
		return namesAnswer(ins, map[string][]string{"local.": {"192.0.2.1"}, standbys: nil, "pg3.local.": {"192.0.2.3"}})
	})
	g.pg.MustExec(t, "DELETE FROM pgcluster_drains WHERE zone IS NOT NULL")
	g.wait(10*time.Second, "zone b undrained", func() error { return namesAnswer(ins, all) })

	// The whole cluster: its names have no address, its nodes' do.
	g.pg.MustExec(t, "INSERT INTO pgcluster_drains (cluster, reason) VALUES ('local', 'site move')")
	g.wait(10*time.Second, "the cluster drained", func() error {
		return namesAnswer(ins, map[string][]string{"local.": nil, primary: nil, standbys: nil, "prod.": nil, "pg1.local.": {"192.0.2.1"}})
	})
	g.pg.MustExec(t, "TRUNCATE pgcluster_drains")
	g.wait(10*time.Second, "the drains truncated", func() error { return namesAnswer(ins, all) })
}

// drainedPlugin serves testNodes with the nodes named drained, the check's
// verdicts view and the settings opts make.
func drainedPlugin(view health.View, drained []string, opts ...func(*settings)) *PgCluster {
	set := &settings{zones: []string{testZone}, ttl: 5, check: checkPostgres, allDown: allDownOpen}
	for _, o := range opts {
		o(set)
	}
	nodes := testNodes()
	for i, n := range nodes {
		if slices.Contains(drained, n.Name) {
			nodes[i].Drain = Drain{ID: int64(i + 1), Reason: "maintenance", By: "ops"}
		}
	}
	return newTestPlugin(buildInput{settings: set, nodes: nodes, aliases: []Alias{{Alias: "prod", Target: "local"}}, view: view})
}

// What a drain takes out of each name: a drained standby leaves the
// cluster's name, standby., sync., SRV and the alias, and stays under its
// own name; a drained primary leaves primary. without an address (TXT
// state=none, drained=) and is never answered by fail-open; a drained
// primary beside another primary is still a split brain; a cluster drained
// whole answers NODATA, its nodes their addresses.
func TestDrainNames(t *testing.T) {
	healthy := health.ViewOf(map[string]health.Verdict{"local/pg1": primaryWith(health.Replica{Name: "pg2", Sync: health.ReplicaSync}),
		"local/pg2": up("standby", 900), "local/pg3": up("standby", 900)})
	p := drainedPlugin(healthy, []string{"pg2"})
	for name, want := range map[string]string{
		"local.": "192.0.2.1", "standby.local.": "", "sync.local.": "", "prod.": "192.0.2.1",
		"primary.local.": "192.0.2.1", "pg2.local.": "192.0.2.2", "prefer-standby.local.": "",
	} {
		if got := addrs(t, p, name); got != want {
			t.Errorf("pg2 drained: %s answers %q, want %q", name, got, want)
		}
	}
	if srv := query(t, p, "_postgresql._tcp.standby.local."+testZone, dns.TypeSRV); len(srv.Answer) != 1 {
		t.Errorf("pg2 drained: SRV of standby. %v, want pg3's alone", srv.Answer)
	}
	if txt := query(t, p, "pg2.local."+testZone, dns.TypeTXT).Answer[0].String(); !strings.Contains(txt, `"drained=maintenance (until undrained, by ops, drain 2)"`) {
		t.Errorf("pg2's TXT: %s", txt)
	}

	p = drainedPlugin(healthy, []string{"pg1"})
	if got := addrs(t, p, "primary.local."); got != "" {
		t.Errorf("pg1 drained: primary. answers %q", got)
	}
	if txt := query(t, p, "primary.local."+testZone, dns.TypeTXT).Answer[0].String(); !strings.Contains(txt, `"state=none" "drained=pg1"`) {
		t.Errorf("pg1 drained: primary.'s TXT %s", txt)
	}
	if got := addrs(t, p, "prefer-standby.local."); got != "192.0.2.2" {
		t.Errorf("pg1 drained: prefer-standby. answers %q, want pg2 (pg3 is IPv6)", got)
	}

	// Every node failing its check: fail-open answers the ones not drained.
	failing := health.ViewOf(map[string]health.Verdict{"local/pg1": down("refused"), "local/pg2": down("refused"), "local/pg3": down("refused")})
	p = drainedPlugin(failing, []string{"pg1", "pg2"})
	if got := addrs(t, p, "primary.local."); got != "" {
		t.Errorf("all down, pg1 drained: primary. answers %q by fail-open", got)
	}
	if got := addrs(t, p, "local."); got != "" {
		t.Errorf("all down, pg1 and pg2 drained: local. answers %q by fail-open (pg3 is IPv6)", got)
	}

	split := health.ViewOf(map[string]health.Verdict{"local/pg1": up("primary", 1000), "local/pg2": up("primary", 900), "local/pg3": up("standby", 900)})
	if got := addrs(t, drainedPlugin(split, []string{"pg2"}), "primary.local."); got != "" {
		t.Errorf("two primaries, one drained: primary. answers %q, want none (a split brain)", got)
	}

	p = drainedPlugin(healthy, []string{"pg1", "pg2", "pg3", "pg4"})
	for name, want := range map[string]string{"local.": "", "primary.local.": "", "prod.": "", "pg1.local.": "192.0.2.1"} {
		if got := addrs(t, p, name); got != want {
			t.Errorf("the cluster drained: %s answers %q, want %q", name, got, want)
		}
	}
	if r := query(t, p, "local."+testZone, dns.TypeA); r.Rcode != dns.RcodeSuccess {
		t.Errorf("the cluster drained: %s, want NODATA", dns.RcodeToString[r.Rcode])
	}
}
