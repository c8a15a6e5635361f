package pgcluster

import (
	"context"
	"net/netip"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/pkg/fall"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
)

const testZone = "pgcluster.lan."

func node(cluster, name, addr, role string) Node {
	return Node{Cluster: cluster, Name: name, Address: netip.MustParseAddr(addr), Port: 5432, Role: role, Healthy: true}
}

// testNodes is a cluster "local" of a primary and two standbys, one of them on
// IPv6 and port 5433, a node the registry marks unhealthy, and a cluster
// "other" whose only node has no role.
func testNodes() []Node {
	n3 := node("local", "pg3", "2001:db8::3", "standby")
	n3.Port = 5433
	down := node("local", "pg4", "192.0.2.4", "standby")
	down.Healthy = false
	return []Node{
		node("local", "pg1", "192.0.2.1", "primary"),
		node("local", "pg2", "192.0.2.2", "standby"),
		n3, down,
		node("other", "x1", "192.0.2.21", "unknown"),
	}
}

var testAliases = []Alias{{Alias: "prod", Target: "local"}, {Alias: "myapp-db", Target: "prod"}}

func newTestPlugin(in buildInput) *PgCluster {
	if in.settings == nil {
		in.settings = &settings{}
	}
	if in.zones == nil {
		in.zones = []string{testZone}
	}
	if in.ttl == 0 {
		in.ttl = 5
	}
	p := &PgCluster{Zones: in.zones, ttl: in.ttl, Next: test.ErrorHandler()}
	s := build(in)
	s.setSerial(1234, in.ttl)
	p.pb = publisherOf(s)
	return p
}

var soa = test.SOA("pgcluster.lan. 5 IN SOA ns.pgcluster.lan. hostmaster.pgcluster.lan. 1234 14400 3600 1209600 5")

var handlerCases = []test.Case{
	{Qname: "pgcluster.lan.", Qtype: dns.TypeSOA, Answer: []dns.RR{soa}},
	{Qname: "pgcluster.lan.", Qtype: dns.TypeNS, Answer: []dns.RR{test.NS("pgcluster.lan. 5 IN NS ns.pgcluster.lan.")}},
	{Qname: "local.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{
		test.A("local.pgcluster.lan. 5 IN A 192.0.2.1"),
		test.A("local.pgcluster.lan. 5 IN A 192.0.2.2"),
	}},
	{Qname: "LOCAL.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{
		test.A("local.pgcluster.lan. 5 IN A 192.0.2.1"),
		test.A("local.pgcluster.lan. 5 IN A 192.0.2.2"),
	}},
	{Qname: "local.pgcluster.lan.", Qtype: dns.TypeAAAA, Answer: []dns.RR{test.AAAA("local.pgcluster.lan. 5 IN AAAA 2001:db8::3")}},
	{Qname: "primary.local.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("primary.local.pgcluster.lan. 5 IN A 192.0.2.1")}},
	{Qname: "primary.local.pgcluster.lan.", Qtype: dns.TypeAAAA, Ns: []dns.RR{soa}},
	{Qname: "standby.local.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("standby.local.pgcluster.lan. 5 IN A 192.0.2.2")}},
	{Qname: "replica.local.pgcluster.lan.", Qtype: dns.TypeAAAA, Answer: []dns.RR{test.AAAA("replica.local.pgcluster.lan. 5 IN AAAA 2001:db8::3")}},
	{Qname: "prefer-standby.local.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("prefer-standby.local.pgcluster.lan. 5 IN A 192.0.2.2")}},
	// No standby serves in "other", and it has no primary either.
	{Qname: "prefer-standby.other.pgcluster.lan.", Qtype: dns.TypeA, Ns: []dns.RR{soa}},
	{Qname: "other.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("other.pgcluster.lan. 5 IN A 192.0.2.21")}},
	{Qname: "pg2.local.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("pg2.local.pgcluster.lan. 5 IN A 192.0.2.2")}},
	{Qname: "pg4.local.pgcluster.lan.", Qtype: dns.TypeA, Ns: []dns.RR{soa}},
	{Qname: "pg4.local.pgcluster.lan.", Qtype: dns.TypeTXT, Answer: []dns.RR{
		test.TXT(`pg4.local.pgcluster.lan. 5 IN TXT "state=out" "role=standby" "address=192.0.2.4" "port=5432" "reason=unhealthy" "detail=the registry marks it unhealthy"`),
	}},
	{Qname: "_postgresql._tcp.local.pgcluster.lan.", Qtype: dns.TypeSRV, Answer: []dns.RR{
		test.SRV("_postgresql._tcp.local.pgcluster.lan. 5 IN SRV 0 10 5432 pg1.local.pgcluster.lan."),
		test.SRV("_postgresql._tcp.local.pgcluster.lan. 5 IN SRV 0 10 5432 pg2.local.pgcluster.lan."),
		test.SRV("_postgresql._tcp.local.pgcluster.lan. 5 IN SRV 0 10 5433 pg3.local.pgcluster.lan."),
	}, Extra: []dns.RR{
		test.A("pg1.local.pgcluster.lan. 5 IN A 192.0.2.1"),
		test.A("pg2.local.pgcluster.lan. 5 IN A 192.0.2.2"),
		test.AAAA("pg3.local.pgcluster.lan. 5 IN AAAA 2001:db8::3"),
	}},
	{Qname: "_postgresql._tcp.primary.local.pgcluster.lan.", Qtype: dns.TypeSRV, Answer: []dns.RR{
		test.SRV("_postgresql._tcp.primary.local.pgcluster.lan. 5 IN SRV 0 10 5432 pg1.local.pgcluster.lan."),
	}, Extra: []dns.RR{test.A("pg1.local.pgcluster.lan. 5 IN A 192.0.2.1")}},
	// An empty non-terminal: NODATA, not NXDOMAIN.
	{Qname: "_tcp.local.pgcluster.lan.", Qtype: dns.TypeA, Ns: []dns.RR{soa}},
	{Qname: "prod.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{
		test.CNAME("prod.pgcluster.lan. 5 IN CNAME local.pgcluster.lan."),
		test.A("local.pgcluster.lan. 5 IN A 192.0.2.1"),
		test.A("local.pgcluster.lan. 5 IN A 192.0.2.2"),
	}},
	{Qname: "myapp-db.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{
		test.CNAME("myapp-db.pgcluster.lan. 5 IN CNAME prod.pgcluster.lan."),
		test.CNAME("prod.pgcluster.lan. 5 IN CNAME local.pgcluster.lan."),
		test.A("local.pgcluster.lan. 5 IN A 192.0.2.1"),
		test.A("local.pgcluster.lan. 5 IN A 192.0.2.2"),
	}},
	{Qname: "primary.myapp-db.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{
		test.CNAME("primary.myapp-db.pgcluster.lan. 5 IN CNAME primary.prod.pgcluster.lan."),
		test.CNAME("primary.prod.pgcluster.lan. 5 IN CNAME primary.local.pgcluster.lan."),
		test.A("primary.local.pgcluster.lan. 5 IN A 192.0.2.1"),
	}},
	{Qname: "prod.pgcluster.lan.", Qtype: dns.TypeCNAME, Answer: []dns.RR{test.CNAME("prod.pgcluster.lan. 5 IN CNAME local.pgcluster.lan.")}},
	// CNAME to a name with no record of the type: NODATA after the CNAME.
	{Qname: "primary.prod.pgcluster.lan.", Qtype: dns.TypeAAAA, Answer: []dns.RR{
		test.CNAME("primary.prod.pgcluster.lan. 5 IN CNAME primary.local.pgcluster.lan."),
	}, Ns: []dns.RR{soa}},
	{Qname: "nope.pgcluster.lan.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{soa}},
	{Qname: "nope.local.pgcluster.lan.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{soa}},
	{Qname: "nope.prod.pgcluster.lan.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{soa}},
	{Qname: "local.pgcluster.lan.", Qtype: dns.TypeANY, Answer: []dns.RR{test.HINFO("local.pgcluster.lan. 5 IN HINFO \"RFC8482\" \"\"")}},
	{Qname: "local.pgcluster.lan.", Qtype: dns.TypeMX, Ns: []dns.RR{soa}},
}

func TestServeDNS(t *testing.T) {
	p := newTestPlugin(buildInput{nodes: testNodes(), aliases: testAliases})
	for _, tc := range handlerCases {
		m := tc.Msg()
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		if _, err := p.ServeDNS(context.Background(), rec, m); err != nil {
			t.Errorf("%s %s: %v", tc.Qname, dns.TypeToString[tc.Qtype], err)
			continue
		}
		if !rec.Msg.Authoritative {
			t.Errorf("%s %s: aa not set", tc.Qname, dns.TypeToString[tc.Qtype])
		}
		if err := test.CNAMEOrder(rec.Msg); err != nil {
			t.Errorf("%s %s: %v", tc.Qname, dns.TypeToString[tc.Qtype], err)
		}
		sort.Sort(test.RRSet(tc.Answer))
		sort.Sort(test.RRSet(tc.Extra))
		if err := test.SortAndCheck(rec.Msg, tc); err != nil {
			t.Errorf("%s %s: %v", tc.Qname, dns.TypeToString[tc.Qtype], err)
		}
	}
}

func TestServeDNSOutsideZone(t *testing.T) {
	p := newTestPlugin(buildInput{nodes: testNodes()})
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	m := new(dns.Msg)
	m.SetQuestion("example.org.", dns.TypeA)
	if rcode, _ := p.ServeDNS(context.Background(), rec, m); rcode != dns.RcodeServerFailure {
		t.Errorf("outside the zone the next plugin answers (here: the error handler); rcode %d", rcode)
	}
}

func TestServeDNSFallthrough(t *testing.T) {
	p := newTestPlugin(buildInput{nodes: testNodes()})
	p.Fall = fall.Root
	p.Next = test.NextHandler(dns.RcodeRefused, nil)
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	m := new(dns.Msg)
	m.SetQuestion("nope.pgcluster.lan.", dns.TypeA)
	if rcode, _ := p.ServeDNS(context.Background(), rec, m); rcode != dns.RcodeRefused {
		t.Errorf("fallthrough should hand a missing name to the next plugin; rcode %d", rcode)
	}
	m.SetQuestion("local.pgcluster.lan.", dns.TypeA)
	rec = dnstest.NewRecorder(&test.ResponseWriter{})
	if rcode, _ := p.ServeDNS(context.Background(), rec, m); rcode != dns.RcodeSuccess || len(rec.Msg.Answer) != 2 {
		t.Errorf("existing names are answered even with fallthrough: rcode %d", rcode)
	}
}

func TestServeDNSNotLoaded(t *testing.T) {
	p := &PgCluster{Zones: []string{testZone}, Next: test.ErrorHandler()}
	m := new(dns.Msg)
	m.SetQuestion("local.pgcluster.lan.", dns.TypeA)
	if rcode, err := p.ServeDNS(context.Background(), dnstest.NewRecorder(&test.ResponseWriter{}), m); rcode != dns.RcodeServerFailure || err == nil {
		t.Errorf("before the first load: rcode %d err %v, want SERVFAIL and an error", rcode, err)
	}
	if p.Ready() {
		t.Error("ready before the first load")
	}
}

func TestRotation(t *testing.T) {
	p := newTestPlugin(buildInput{nodes: testNodes()})
	first := map[string]bool{}
	for range 6 {
		m := new(dns.Msg)
		m.SetQuestion("local.pgcluster.lan.", dns.TypeA)
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		p.ServeDNS(context.Background(), rec, m)
		if len(rec.Msg.Answer) != 2 {
			t.Fatalf("answer: %v", rec.Msg.Answer)
		}
		first[rec.Msg.Answer[0].(*dns.A).A.String()] = true
	}
	if len(first) != 2 {
		t.Errorf("every address should come first in turn; first addresses seen: %v", first)
	}
}

func TestTwoPrimaries(t *testing.T) {
	nodes := append(testNodes(), node("local", "pg5", "192.0.2.5", "primary"))
	p := newTestPlugin(buildInput{nodes: nodes})
	tc := test.Case{Qname: "primary.local.pgcluster.lan.", Qtype: dns.TypeA, Ns: []dns.RR{soa}}
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	p.ServeDNS(context.Background(), rec, tc.Msg())
	if err := test.SortAndCheck(rec.Msg, tc); err != nil {
		t.Errorf("while two nodes claim primary, primary. has no address: %v", err)
	}
	// Both still serve under the cluster name.
	if n := len(entryOf(p.snapshot(), "local.pgcluster.lan.").a); n != 3 {
		t.Errorf("cluster name has %d IPv4 addresses, want 3", n)
	}
}

func TestLoopbackAndSelf(t *testing.T) {
	nodes := []Node{
		node("local", "pg1", "127.0.0.1", "primary"),
		node("local", "pg2", "127.0.0.2", "standby"),
		node("local", "pg3", "::1", "standby"),
		node("local", "pg4", "192.0.2.4", "standby"),
	}
	s := build(buildInput{settings: &settings{zones: []string{testZone}, ttl: 5, self: map[string]netip.Addr{"pg1": netip.MustParseAddr("192.0.2.100"), "local/pg3": netip.MustParseAddr("2001:db8::100")}}, nodes: nodes})
	got := addrsOf(entryOf(s, "local.pgcluster.lan."))
	want := "192.0.2.100 192.0.2.4 2001:db8::100"
	if got != want {
		t.Errorf("loopback filtered, self substituted: got %q want %q", got, want)
	}
	if txt := entryOf(s, "pg2.local.pgcluster.lan.").txt.String(); !strings.Contains(txt, "loopback address 127.0.0.2 is not advertised") {
		t.Errorf("TXT should say why pg2 is out: %s", txt)
	}
	s = build(buildInput{settings: &settings{zones: []string{testZone}, ttl: 5, allowLoopback: true}, nodes: nodes})
	if got := addrsOf(entryOf(s, "local.pgcluster.lan.")); got != "127.0.0.1 127.0.0.2 192.0.2.4 ::1" {
		t.Errorf("allow_loopback: %q", got)
	}
}

func TestStaleAfter(t *testing.T) {
	nodes := testNodes()
	nodes[1].HeartbeatAge = 11 * time.Second
	s := build(buildInput{settings: &settings{zones: []string{testZone}, ttl: 5, staleAfter: 10 * time.Second}, nodes: nodes})
	if got := addrsOf(entryOf(s, "standby.local.pgcluster.lan.")); got != "2001:db8::3" {
		t.Errorf("a stale standby is out: %q", got)
	}
	if txt := entryOf(s, "pg2.local.pgcluster.lan.").txt.String(); !strings.Contains(txt, "heartbeat 11s old, older than stale_after 10s") {
		t.Errorf("TXT: %s", txt)
	}
	s = build(buildInput{settings: &settings{zones: []string{testZone}, ttl: 5}, nodes: nodes})
	if got := addrsOf(entryOf(s, "standby.local.pgcluster.lan.")); got != "192.0.2.2 2001:db8::3" {
		t.Errorf("without stale_after, heartbeats are not judged: %q", got)
	}
}

func TestSkippedRows(t *testing.T) {
	nodes := append(testNodes(),
		node("local", "primary", "192.0.2.9", "standby"),  // reserved label
		node("local", "bad_name", "192.0.2.9", "standby"), // not a label
		node("ns", "n1", "192.0.2.9", "standby"),          // reserved cluster
		node("Local", "PG1", "192.0.2.9", "standby"),      // duplicate once lowercased
		node("local", "-x", "192.0.2.9", "standby"),       // not a label
	)
	aliases := append(testAliases,
		Alias{Alias: "loop1", Target: "loop2"}, Alias{Alias: "loop2", Target: "loop1"}, // loop
		Alias{Alias: "dangling", Target: "nowhere"}, // to nothing
		Alias{Alias: "other", Target: "local"},      // shadows a cluster
		Alias{Alias: "via-loop", Target: "loop1"},   // into a loop
	)
	s := build(buildInput{settings: &settings{zones: []string{testZone}, ttl: 5}, nodes: nodes, aliases: aliases})
	counts := map[string]int{}
	for _, sk := range allSkipped(s) {
		counts[sk.reason]++
	}
	want := map[string]int{skipReservedName: 2, skipInvalidName: 2, skipDuplicate: 2, skipAliasLoop: 3, skipAliasDangling: 1}
	for r, n := range want {
		if counts[r] != n {
			t.Errorf("skipped %s: %d, want %d (all: %v)", r, counts[r], n, allSkipped(s))
		}
	}
	if got := addrsOf(entryOf(s, "local.pgcluster.lan.")); got != "192.0.2.1 192.0.2.2 2001:db8::3" {
		t.Errorf("the valid rows are still served: %q", got)
	}
	if entryOf(s, "loop1.pgcluster.lan.") != nil || entryOf(s, "dangling.pgcluster.lan.") != nil {
		t.Error("skipped aliases must not be served")
	}
	if o, ok := owners(s)["other.pgcluster.lan."]; !ok || o.alias != nil {
		t.Error("a cluster wins over an alias of the same name")
	}
}

func TestContentHash(t *testing.T) {
	in := buildInput{settings: &settings{zones: []string{testZone}, ttl: 5}, nodes: testNodes(), aliases: testAliases}
	a, b := build(in), build(in)
	if a.hash != b.hash {
		t.Error("the same rows must give the same hash")
	}
	nodes := testNodes()
	nodes[1].Role = "primary"
	in.nodes = nodes
	if c := build(in); c.hash == a.hash {
		t.Error("a role change must change the hash")
	}
	nodes = testNodes()
	nodes[0].HeartbeatAge = time.Hour
	in.nodes = nodes
	if c := build(in); c.hash != a.hash {
		t.Error("a heartbeat alone, without stale_after, must not change the hash")
	}
}

func TestMultipleZones(t *testing.T) {
	p := newTestPlugin(buildInput{settings: &settings{zones: []string{"a.lan.", "b.lan."}}, nodes: testNodes(), aliases: testAliases})
	for _, q := range []string{"primary.prod.a.lan.", "primary.prod.b.lan."} {
		m := new(dns.Msg)
		m.SetQuestion(q, dns.TypeA)
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		p.ServeDNS(context.Background(), rec, m)
		if len(rec.Msg.Answer) != 2 {
			t.Errorf("%s: %v", q, rec.Msg.Answer)
		}
	}
}

func addrsOf(e *entry) string {
	var out []string
	a, aaaa, _, _ := records(e)
	for _, rr := range append(a, aaaa...) {
		switch r := rr.(type) {
		case *dns.A:
			out = append(out, r.A.String())
		case *dns.AAAA:
			out = append(out, r.AAAA.String())
		}
	}
	return strings.Join(out, " ")
}

// A free-text role that is long or not ASCII must not break the TXT answer
// (found by FuzzBuild).
func TestOddRoleTXT(t *testing.T) {
	n := node("local", "pg1", "192.0.2.1", strings.Repeat("\x9f\"\\x", 100))
	p := newTestPlugin(buildInput{nodes: []Node{n}})
	m := new(dns.Msg)
	m.SetQuestion("pg1.local.pgcluster.lan.", dns.TypeTXT)
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	p.ServeDNS(context.Background(), rec, m)
	if _, err := rec.Msg.Pack(); err != nil {
		t.Fatalf("TXT answer does not pack: %v", err)
	}
	// Lower-casing turns the invalid byte \x9f into U+FFFD, three bytes.
	if txt := rec.Msg.Answer[0].(*dns.TXT).Txt[1]; txt != "role="+strings.Repeat("?????x", 10)+"???" {
		t.Errorf("role shown as %q", txt)
	}
}

// NOTIFY is no query, and zone transfers are refused as CoreDNS's file plugin
// refuses them without the transfer plugin. The plugin returns the rcode and
// writes nothing: CoreDNS's server writes it.
func TestOpcodeAndTransfer(t *testing.T) {
	p := newTestPlugin(buildInput{nodes: testNodes()})
	notify := new(dns.Msg)
	notify.SetNotify(testZone)
	axfr := new(dns.Msg)
	axfr.SetAxfr(testZone)
	ixfr := new(dns.Msg)
	ixfr.SetIxfr(testZone, 1, "ns.pgcluster.lan.", "hostmaster.pgcluster.lan.")
	for _, tc := range []struct {
		what  string
		m     *dns.Msg
		rcode int
	}{
		{"NOTIFY", notify, dns.RcodeNotImplemented},
		{"AXFR", axfr, dns.RcodeRefused},
		{"IXFR", ixfr, dns.RcodeRefused},
	} {
		rec := dnstest.NewRecorder(&test.ResponseWriter{TCP: true})
		rcode, err := p.ServeDNS(context.Background(), rec, tc.m)
		if rcode != tc.rcode || err != nil || rec.Msg != nil {
			t.Errorf("%s: rcode %s, err %v, wrote %v; want %s and nothing written", tc.what, dns.RcodeToString[rcode], err, rec.Msg, dns.RcodeToString[tc.rcode])
		}
	}
}

// publisherOf returns a publisher whose snapshot is s, as if it had made
// and stored it.
func publisherOf(s *snapshot) *publisher {
	pb := newPublisher(s.set, nil, false)
	pb.snap.Store(s)
	return pb
}

// publisherFor gives p a publisher of set, without checks, and returns it.
func publisherFor(p *PgCluster, set *settings) *publisher {
	p.pb = newPublisher(set, nil, false)
	return p.pb
}
