package pgcluster

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
)

// apexBlock is a pgcluster block for zone pgcluster.lan. with extra option
// lines.
func apexBlock(lines ...string) string {
	return "pgcluster pgcluster.lan {\n postgres " + dsn + "\n " + strings.Join(lines, "\n ") + "\n}"
}

func TestSetupApexOptions(t *testing.T) {
	cfg := func(t *testing.T, lines ...string) *settings {
		t.Helper()
		_, s, err := parse(caddy.NewTestController("dns", apexBlock(lines...)))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	t.Run("defaults", func(t *testing.T) {
		s := cfg(t)
		if len(s.ns) != 0 || s.soa != (soaTimers{}) {
			t.Errorf("ns %v, soa %+v: want neither set", s.ns, s.soa)
		}
		want := soaTimers{refresh: 4 * 3600, retry: 3600, expire: 14 * 86400, negative: 7}
		if got := s.soa.orDefault(7); got != want {
			t.Errorf("default SOA timers %+v, want %+v", got, want)
		}
		if ns := s.nameServers("pgcluster.lan."); len(ns) != 1 || ns[0].name != "ns.pgcluster.lan." {
			t.Errorf("default NS set %v, want ns.pgcluster.lan.", ns)
		}
	})
	t.Run("ns and soa", func(t *testing.T) {
		s := cfg(t, "ns NS1.pgcluster.lan 192.0.2.53 2001:db8::53", "ns a.b.ns2.pgcluster.lan. ::ffff:192.0.2.54",
			"ns dns.example.net", "soa 2h 30m 1209600 60")
		names := []string{}
		for _, ns := range s.ns {
			names = append(names, ns.name)
		}
		if got := strings.Join(names, " "); got != "ns1.pgcluster.lan. a.b.ns2.pgcluster.lan. dns.example.net." {
			t.Errorf("NS set in order given, in lower case: %s", got)
		}
		if len(s.ns[0].addrs) != 2 || s.ns[1].addrs[0].String() != "192.0.2.54" || len(s.ns[2].addrs) != 0 {
			t.Errorf("addresses: %v", s.ns)
		}
		if !s.reservedZoneLabel("ns1") || !s.reservedZoneLabel("ns2") || !s.reservedZoneLabel("ns") || s.reservedZoneLabel("dns") {
			t.Errorf("reserved labels %v: want ns, ns1 and ns2 (the in-zone names' labels just below the zone)", s.nsLabels)
		}
		if want := (soaTimers{refresh: 7200, retry: 1800, expire: 1209600, negative: 60}); s.soa != want {
			t.Errorf("soa %+v, want %+v", s.soa, want)
		}
	})
	// Each error names the option and the line it is on (line 1 is the
	// pgcluster line, 2 the postgres line).
	for _, tc := range []struct{ lines, want string }{
		{"ns", "Wrong argument count"},
		{"ns bad_name!.pgcluster.lan 192.0.2.53", "ns:"},
		{"ns . ", "ns:"},
		{"ns pgcluster.lan 192.0.2.53", "is the zone's apex"},
		{"ns ns1.pgcluster.lan", "needs its addresses"},
		{"ns dns.example.net 192.0.2.53", "outside the zones served here"},
		{"ns ns1.pgcluster.lan 192.0.2.300", "not a unicast IPv4 or IPv6 address"},
		{"ns ns1.pgcluster.lan 224.0.0.53", "not a unicast"},
		{"ns ns1.pgcluster.lan 0.0.0.0", "not a unicast"},
		{"ns ns1.pgcluster.lan fe80::1%eth0", "not a unicast"},
		{"ns ns1.pgcluster.lan 192.0.2.53\n ns NS1.pgcluster.lan. 192.0.2.54", "given twice"},
		{"ns x.ns_1.pgcluster.lan 192.0.2.53", "not a DNS label"},
		{"soa 4h 1h 336h", "want four values"},
		{"soa 4h 1h 336h 30s 1", "want four values"},
		{"soa 4h 1h 336h soon", `"soon" is not a number of seconds`},
		{"soa 0 1h 336h 30s", "is not a number of seconds"},
		{"soa 4h 1h 336h 1500ms", "is not a number of seconds"},
		{"soa 4h 1h 336h 4294967296", "is not a number of seconds"},
		{"soa 1h 1h 336h 30s", "retry 3600 s must be shorter than refresh"},
		{"soa 4h 1h 5h 30s", "expire 18000 s must be longer than refresh + retry"},
		{"soa 4h 1h 336h 2d", "is not a number of seconds"},
		{"soa 4h 1h 336h 86401", "negative TTL 86401 s is above 86400"},
		{"soa 4h 1h 336h 30\n soa 4h 1h 336h 30", "soa: given twice"},
	} {
		input := apexBlock(tc.lines)
		err := setup(caddy.NewTestController("dns", input))
		line := ":3 "
		if strings.Contains(tc.lines, "\n") {
			line = ":4 "
		}
		opt := strings.Fields(tc.lines)[0]
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), line) ||
			!strings.Contains(err.Error(), "pgcluster") || !strings.Contains(err.Error(), opt) {
			t.Errorf("%q: want an error naming pgcluster, %s, line %s and %q; got %v", tc.lines, opt, line, tc.want, err)
		}
	}
}

// apexPlugin builds a plugin from the pgcluster block with lines, serving
// testNodes and aliases, with serial 1234.
func apexPlugin(t *testing.T, aliases []Alias, nodes []Node, lines ...string) (*PgCluster, *snapshot) {
	t.Helper()
	_, set, err := parse(caddy.NewTestController("dns", apexBlock(lines...)))
	if err != nil {
		t.Fatal(err)
	}
	set.ttl = 5
	p := &PgCluster{Zones: set.zones, ttl: set.ttl, Next: test.ErrorHandler()}
	s := build(buildInput{settings: set, nodes: nodes, aliases: aliases})
	s.setSerial(1234, set.ttl)
	p.pb = publisherOf(s)
	return p, s
}

func runCases(t *testing.T, p *PgCluster, cases []test.Case) {
	t.Helper()
	for _, tc := range cases {
		m := tc.Msg()
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		if _, err := p.ServeDNS(context.Background(), rec, m); err != nil {
			t.Errorf("%s %s: %v", tc.Qname, dns.TypeToString[tc.Qtype], err)
			continue
		}
		sort.Sort(test.RRSet(tc.Answer))
		if err := test.SortAndCheck(rec.Msg, tc); err != nil {
			t.Errorf("%s %s: %v\n%v", tc.Qname, dns.TypeToString[tc.Qtype], err, rec.Msg)
		}
	}
}

// soaOf asks p for the SOA of the zone.
func soaOf(t *testing.T, p *PgCluster) *dns.SOA {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(testZone, dns.TypeSOA)
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	if _, err := p.ServeDNS(context.Background(), rec, m); err != nil || len(rec.Msg.Answer) != 1 {
		t.Fatalf("SOA: %v %v", err, rec.Msg)
	}
	return rec.Msg.Answer[0].(*dns.SOA)
}

func TestApexNameServers(t *testing.T) {
	nodes := append(testNodes(),
		node("ns1", "pg1", "192.0.2.91", "primary"), // a cluster named like a name server
		node("ns", "pg1", "192.0.2.92", "primary"),  // and like the default one
	)
	aliases := append(testAliases, Alias{Alias: "ns2", Target: "local"}, Alias{Alias: "NS", Target: "local"})
	p, s := apexPlugin(t, aliases, nodes,
		"ns ns1.pgcluster.lan 192.0.2.53 2001:db8::53", "ns a.ns2.pgcluster.lan 192.0.2.54", "ns dns.example.net",
		"soa 7200 1800 1209600 60")
	nsoa := test.SOA("pgcluster.lan. 60 IN SOA ns1.pgcluster.lan. hostmaster.pgcluster.lan. 1234 7200 1800 1209600 60")
	runCases(t, p, []test.Case{
		{Qname: "pgcluster.lan.", Qtype: dns.TypeNS, Answer: []dns.RR{
			test.NS("pgcluster.lan. 5 IN NS ns1.pgcluster.lan."),
			test.NS("pgcluster.lan. 5 IN NS a.ns2.pgcluster.lan."),
			test.NS("pgcluster.lan. 5 IN NS dns.example.net."),
		}, Extra: []dns.RR{ // glue: the in-zone name servers' addresses
			test.A("a.ns2.pgcluster.lan. 5 IN A 192.0.2.54"),
			test.A("ns1.pgcluster.lan. 5 IN A 192.0.2.53"),
			test.AAAA("ns1.pgcluster.lan. 5 IN AAAA 2001:db8::53"),
		}},
		{Qname: "ns1.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("ns1.pgcluster.lan. 5 IN A 192.0.2.53")}},
		{Qname: "NS1.pgcluster.lan.", Qtype: dns.TypeAAAA, Answer: []dns.RR{test.AAAA("ns1.pgcluster.lan. 5 IN AAAA 2001:db8::53")}},
		{Qname: "a.ns2.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("a.ns2.pgcluster.lan. 5 IN A 192.0.2.54")}},
		{Qname: "a.ns2.pgcluster.lan.", Qtype: dns.TypeAAAA, Ns: []dns.RR{nsoa}},
		// The label above an in-zone name server's name exists, empty.
		{Qname: "ns2.pgcluster.lan.", Qtype: dns.TypeA, Ns: []dns.RR{nsoa}},
		{Qname: "b.ns2.pgcluster.lan.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{nsoa}},
		{Qname: "pg1.ns1.pgcluster.lan.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{nsoa}},
		// With ns options, ns.<zone> is no name server; its label stays reserved.
		{Qname: "ns.pgcluster.lan.", Qtype: dns.TypeA, Rcode: dns.RcodeNameError, Ns: []dns.RR{nsoa}},
		{Qname: "prod.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{
			test.CNAME("prod.pgcluster.lan. 5 IN CNAME local.pgcluster.lan."),
			test.A("local.pgcluster.lan. 5 IN A 192.0.2.1"),
			test.A("local.pgcluster.lan. 5 IN A 192.0.2.2"),
		}},
	})
	got := soaOf(t, p)
	if got.Ns != "ns1.pgcluster.lan." || got.Refresh != 7200 || got.Retry != 1800 || got.Expire != 1209600 || got.Minttl != 60 || got.Hdr.Ttl != 60 {
		t.Errorf("SOA %v: want MNAME the first ns, the soa option's timers, TTL and MINIMUM the negative TTL", got)
	}
	var reserved []string
	for _, sk := range allSkipped(s) {
		if sk.reason == skipReservedName {
			reserved = append(reserved, sk.what)
		}
	}
	if len(reserved) != 4 {
		t.Errorf("want the clusters ns1 and ns and the aliases ns2 and NS skipped as %s; skipped: %v", skipReservedName, allSkipped(s))
	}

	// An alias change resolves the aliases again: the name servers' names
	// stay.
	n := s.next(change{rowsUpdate: rowsUpdate{aliases: append(aliases, Alias{Alias: "ns1", Target: "local"}), aliasesSet: true}})
	n.setSerial(1235, 5)
	p.pb = publisherOf(n)
	runCases(t, p, []test.Case{
		{Qname: "ns1.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("ns1.pgcluster.lan. 5 IN A 192.0.2.53")}},
		{Qname: "a.ns2.pgcluster.lan.", Qtype: dns.TypeA, Answer: []dns.RR{test.A("a.ns2.pgcluster.lan. 5 IN A 192.0.2.54")}},
	})
}

// TestApexDefault: without ns and soa options, one name server ns.<zone>
// with this host's addresses, and the default SOA timers.
func TestApexDefault(t *testing.T) {
	p, s := apexPlugin(t, testAliases, testNodes())
	s.set.nsAddrs = nil // not resolved: parse alone does not look
	runCases(t, p, []test.Case{
		{Qname: "pgcluster.lan.", Qtype: dns.TypeNS, Answer: []dns.RR{test.NS("pgcluster.lan. 5 IN NS ns.pgcluster.lan.")}},
	})
	got := soaOf(t, p)
	if got.Ns != "ns.pgcluster.lan." || got.Refresh != 14400 || got.Retry != 3600 || got.Expire != 1209600 || got.Minttl != 5 || got.Hdr.Ttl != 5 {
		t.Errorf("SOA %v: want MNAME ns.pgcluster.lan., refresh 4h, retry 1h, expire 14 days, negative TTL the ttl", got)
	}
}

// An NS answer carries the glue of the name servers inside the zone, as
// much as fits the client's buffer: over UDP without EDNS (512 octets) ten
// name servers, their A records and four of their AAAA records fit, and the
// reply is neither cut by CoreDNS's writer nor marked truncated; with
// EDNS0 4096 every address is there.
func TestApexGlueFits(t *testing.T) {
	var lines []string
	for i := range 10 {
		lines = append(lines, fmt.Sprintf("ns ns%d.pgcluster.lan 192.0.2.%d 2001:db8::%d", i, 50+i, 50+i))
	}
	p, _ := apexPlugin(t, nil, testNodes(), lines...)
	for _, tc := range []struct {
		size        uint16
		a, aaaa     int
		description string
	}{
		{0, 10, 4, "UDP, no EDNS"},
		{4096, 10, 10, "UDP, EDNS0 4096"},
	} {
		wrote, got := serve(t, p, ask{name: testZone, qtype: dns.TypeNS, size: tc.size}, false)
		if got.Truncated || len(got.Answer) != 10 || len(got.Extra) != len(wrote.Extra)+min(int(tc.size), 1) {
			t.Errorf("%s: TC %t, %d NS, additional %d (pgcluster wrote %d): the writer cut the reply\n%v", tc.description, got.Truncated, len(got.Answer), len(got.Extra), len(wrote.Extra), got)
			continue
		}
		var a, aaaa int
		for _, rr := range got.Extra {
			switch rr.(type) {
			case *dns.A:
				a++
			case *dns.AAAA:
				aaaa++
			}
		}
		if a != tc.a || aaaa != tc.aaaa {
			t.Errorf("%s: glue %d A and %d AAAA, want %d and %d\n%v", tc.description, a, aaaa, tc.a, tc.aaaa, got)
		}
	}
}
