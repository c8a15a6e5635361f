package pgcluster

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
)

// twoZones is cluster "local" of three nodes in zone a and three in zone
// b, both of region r, a primary in each; networks place 10.1.0.0/16 in a,
// 10.2.0.0/16 in b.
func twoZones() ([]Node, []Network) {
	var nodes []Node
	for i, z := range []string{"a", "a", "a", "b", "b", "b"} {
		role := roleStandby
		if i == 0 {
			role = rolePrimary
		}
		n := node("local", "pg"+string(rune('1'+i)), "192.0.2."+string(rune('1'+i)), role)
		n.Region, n.Zone = "r", z
		nodes = append(nodes, n)
	}
	return nodes, []Network{
		{Network: netip.MustParsePrefix("10.1.0.0/16"), Region: "r", Zone: "a"},
		{Network: netip.MustParsePrefix("10.2.0.0/16"), Region: "r", Zone: "b"},
	}
}

func topologyPlugin(mode string, minLocal int, nodes []Node, networks []Network, aliases []Alias) *PgCluster {
	set := &settings{zones: []string{testZone}, ttl: 5, topology: mode, minLocal: minLocal}
	p := newTestPlugin(buildInput{settings: set, nodes: nodes, networks: networks, aliases: aliases})
	p.topology, p.minLocal, p.topo = mode, minLocal, newTopologyCounters(set)
	return p
}

// askFrom sends a query for name and qtype, with ECS from subnet when given,
// from the source address src, and returns the reply.
func askFrom(t *testing.T, p *PgCluster, name string, qtype uint16, subnet, src string) *dns.Msg {
	t.Helper()
	r := new(dns.Msg)
	r.SetQuestion(name, qtype)
	r.Id = 4242 // replies compared byte for byte
	if subnet != "" {
		pfx := netip.MustParsePrefix(subnet)
		family := uint16(ecsFamilyIPv4)
		if pfx.Addr().Is6() {
			family = ecsFamilyIPv6
		}
		o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		o.SetUDPSize(1232)
		o.Option = []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: family, SourceNetmask: uint8(pfx.Bits()), Address: net.IP(pfx.Addr().AsSlice())}}
		r.Extra = []dns.RR{o}
	}
	rec := dnstest.NewRecorder(&test.ResponseWriter{RemoteIP: src})
	code, err := p.ServeDNS(context.Background(), rec, r)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Msg == nil {
		return &dns.Msg{MsgHdr: dns.MsgHdr{Rcode: code}}
	}
	return rec.Msg
}

// replyScope is the reply's ECS SCOPE PREFIX-LENGTH, -1 without ECS.
func replyScope(m *dns.Msg) int {
	if o := m.IsEdns0(); o != nil {
		for _, opt := range o.Option {
			if s, ok := opt.(*dns.EDNS0_SUBNET); ok {
				return int(s.SourceScope)
			}
		}
	}
	return -1
}

func answerAddrs(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			out = append(out, rr.A.String())
		case *dns.AAAA:
			out = append(out, rr.AAAA.String())
		}
	}
	return out
}

func zoneOfAddr(a string) string {
	if a <= "192.0.2.3" {
		return "a"
	}
	return "b"
}

func zonesOf(addrs []string) string {
	var z []string
	for _, a := range addrs {
		z = append(z, zoneOfAddr(a))
	}
	return strings.Join(z, "")
}

// prefer answers every node, the client's zone first (rotated within),
// local only the client's zone; the scope is the network's prefix; SRV
// priority is 0 in the zone, 10 in the region; an unmapped client gets
// every node in the order of topology off.
func TestTopologyAnswers(t *testing.T) {
	nodes, networks := twoZones()
	prefer := topologyPlugin(topologyPrefer, 1, nodes, networks, []Alias{{Alias: "prod", Target: "local"}})
	local := topologyPlugin(topologyLocal, 1, nodes, networks, []Alias{{Alias: "prod", Target: "local"}})
	for _, tc := range []struct {
		subnet, zone string
	}{{"10.1.7.0/24", "a"}, {"10.2.0.0/24", "b"}} {
		firsts := map[string]bool{}
		for range 3 {
			m := askFrom(t, prefer, "local."+testZone, dns.TypeA, tc.subnet, "")
			got := answerAddrs(m)
			if zonesOf(got) != strings.Repeat(tc.zone, 3)+strings.Repeat(map[string]string{"a": "b", "b": "a"}[tc.zone], 3) {
				t.Errorf("prefer %s: %v", tc.subnet, got)
			}
			if replyScope(m) != 16 {
				t.Errorf("prefer %s: scope %d, want 16", tc.subnet, replyScope(m))
			}
			firsts[got[0]] = true
		}
		if len(firsts) != 3 {
			t.Errorf("prefer %s: the zone's group does not rotate: firsts %v", tc.subnet, firsts)
		}
		m := askFrom(t, local, "prod."+testZone, dns.TypeA, tc.subnet, "")
		if got := answerAddrs(m); zonesOf(got) != strings.Repeat(tc.zone, 3) || replyScope(m) != 16 {
			t.Errorf("local %s via alias: %v scope %d", tc.subnet, got, replyScope(m))
		}
		m = askFrom(t, local, "_postgresql._tcp.local."+testZone, dns.TypeSRV, tc.subnet, "")
		if len(m.Answer) != 3 || m.Answer[0].(*dns.SRV).Priority != 0 {
			t.Errorf("local SRV %s: %v", tc.subnet, m.Answer)
		}
		m = askFrom(t, prefer, "_postgresql._tcp.local."+testZone, dns.TypeSRV, tc.subnet, "")
		var prios []uint16
		for _, rr := range m.Answer {
			prios = append(prios, rr.(*dns.SRV).Priority)
		}
		if !slices.Equal(prios, []uint16{0, 0, 0, 10, 10, 10}) {
			t.Errorf("prefer SRV %s: priorities %v", tc.subnet, prios)
		}
	}
	// Without ECS, the packet's source places the client.
	if got := answerAddrs(askFrom(t, local, "local."+testZone, dns.TypeA, "", "10.2.3.4")); zonesOf(got) != "bbb" {
		t.Errorf("local from 10.2.3.4: %v", got)
	}
	// Unmapped: every node, as with topology off; a scope that leaves
	// both networks out.
	m := askFrom(t, local, "local."+testZone, dns.TypeA, "192.0.2.0/24", "")
	if got := answerAddrs(m); len(got) != 6 || replyScope(m) != 1 {
		t.Errorf("unmapped: %v scope %d", got, replyScope(m))
	}
	// A name the same everywhere, and SOURCE 0: scope 0.
	for _, q := range []struct {
		name, subnet string
		qtype        uint16
	}{{"pg1.local." + testZone, "10.1.0.0/24", dns.TypeA}, {"local." + testZone, "10.1.0.0/24", dns.TypeTXT}, {"local." + testZone, "0.0.0.0/0", dns.TypeA}, {"nx." + testZone, "10.1.0.0/24", dns.TypeA}} {
		if m := askFrom(t, local, q.name, q.qtype, q.subnet, ""); replyScope(m) != 0 {
			t.Errorf("%s %s: scope %d, want 0", q.name, q.subnet, replyScope(m))
		}
	}
}

// local widens when the client's zone has fewer than min_local serving
// nodes: to its region, then to every node; it never answers NODATA for a
// name that has addresses elsewhere.
func TestTopologyLocalWidens(t *testing.T) {
	nodes, networks := twoZones()
	for i := range 3 {
		nodes[i].Healthy = false // zone a has none
	}
	networks = append(networks, Network{Network: netip.MustParsePrefix("10.3.0.0/16"), Region: "elsewhere", Zone: "c"})
	p := topologyPlugin(topologyLocal, 1, nodes, networks, nil)
	if got := answerAddrs(askFrom(t, p, "local."+testZone, dns.TypeA, "10.1.0.0/24", "")); zonesOf(got) != "bbb" {
		t.Errorf("zone a empty: %v, want zone b's (its region)", got)
	}
	if got := answerAddrs(askFrom(t, p, "local."+testZone, dns.TypeA, "10.3.0.0/24", "")); zonesOf(got) != "bbb" {
		t.Errorf("region elsewhere: %v, want every serving node", got)
	}
	if m := askFrom(t, p, "local."+testZone, dns.TypeAAAA, "10.2.0.0/24", ""); m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 {
		t.Errorf("AAAA: %v", m)
	}
	nodes, networks = twoZones()
	p = topologyPlugin(topologyLocal, 4, nodes, networks, nil)
	if got := answerAddrs(askFrom(t, p, "local."+testZone, dns.TypeA, "10.1.0.0/24", "")); zonesOf(got) != "aaabbb" {
		t.Errorf("min_local 4: %v, want the region, zone a first", got)
	}
	if got := answerAddrs(askFrom(t, p, "standby.local."+testZone, dns.TypeA, "10.2.0.0/24", "")); zonesOf(got) != "bbbaa" {
		t.Errorf("standby. min_local 4: %v", got)
	}
}

// _client.<zone> says what the instance decided for the asker.
func TestClientTXT(t *testing.T) {
	nodes, networks := twoZones()
	p := topologyPlugin(topologyPrefer, 1, nodes, networks, nil)
	m := askFrom(t, p, "_client."+testZone, dns.TypeTXT, "10.1.9.0/24", "")
	if len(m.Answer) != 1 || strings.Join(m.Answer[0].(*dns.TXT).Txt, " ") != "address=10.1.9.0/24 from=ecs network=10.1.0.0/16 region=r zone=a scope=16" || replyScope(m) != 24 {
		t.Errorf("_client: %v scope %d", m.Answer, replyScope(m))
	}
	m = askFrom(t, p, "_client."+testZone, dns.TypeTXT, "", "127.0.0.9")
	if len(m.Answer) != 1 || !strings.HasPrefix(strings.Join(m.Answer[0].(*dns.TXT).Txt, " "), "address=127.0.0.9/32 from=source network=none region=- zone=-") {
		t.Errorf("_client from source: %v", m.Answer)
	}
}

// topology off answers exactly as before: the same bytes whether or not
// the registry has places and networks, with ECS or without.
func TestTopologyOffUnchanged(t *testing.T) {
	plain := testNodes()
	placed, networks := testNodes(), []Network{{Network: netip.MustParsePrefix("10.0.0.0/8"), Region: "r", Zone: "a"}}
	for i := range placed {
		placed[i].Region, placed[i].Zone = "r", []string{"a", "b"}[i%2]
	}
	before := topologyPlugin(topologyOff, 1, plain, nil, testAliases)
	after := topologyPlugin(topologyOff, 1, placed, networks, testAliases)
	for _, name := range []string{"local", "primary.local", "standby.local", "replica.local", "prefer-standby.local", "_postgresql._tcp.local", "_postgresql._tcp.standby.local", "prod", "primary.prod", "myapp-db", "_postgresql._tcp.prod"} {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeTXT} {
			for _, subnet := range []string{"", "10.1.0.0/24"} {
				for range 3 { // through the rotation
					a := askFrom(t, before, name+"."+testZone, qtype, subnet, "10.1.2.3")
					b := askFrom(t, after, name+"."+testZone, qtype, subnet, "10.1.2.3")
					pa, _ := a.Pack()
					pb, _ := b.Pack()
					if !bytes.Equal(pa, pb) {
						t.Errorf("%s %s %q: off answers differ with places:\n%v\n%v", name, dns.TypeToString[qtype], subnet, a, b)
					}
				}
			}
		}
	}
}

// Every malformed ECS option is FORMERR, never a crash.
func TestECSMalformed(t *testing.T) {
	nodes, networks := twoZones()
	p := topologyPlugin(topologyLocal, 1, nodes, networks, nil)
	query := func(ecs *dns.EDNS0_SUBNET) *dns.Msg {
		r := new(dns.Msg)
		r.SetQuestion("local."+testZone, dns.TypeA)
		o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
		o.Option = []dns.EDNS0{ecs}
		r.Extra = []dns.RR{o}
		return r
	}
	v4 := func(source uint8, a string) *dns.EDNS0_SUBNET {
		return &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: source, Address: net.ParseIP(a)}
	}
	for name, r := range map[string]*dns.Msg{
		"family 3":             query(&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 3, SourceNetmask: 8, Address: net.ParseIP("10.0.0.0")}),
		"family 0, source 8":   query(&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 0, SourceNetmask: 8, Address: net.ParseIP("10.0.0.0")}),
		"IPv4 source 33":       query(v4(33, "10.1.0.0")),
		"IPv6 source 129":      query(&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 2, SourceNetmask: 129, Address: net.ParseIP("2001:db8::")}),
		"bits beyond the /16":  query(v4(16, "10.1.0.1")),
		"IPv4 in family 2 /24": query(&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 2, SourceNetmask: 24, Address: net.ParseIP("10.1.0.0").To4()}),
	} {
		if _, err := queryECS(r); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if m := ask2(t, p, r); m.Rcode != dns.RcodeFormatError {
			t.Errorf("%s: rcode %s, want FORMERR", name, dns.RcodeToString[m.Rcode])
		}
	}
	// On the wire: an ADDRESS of one octet more or fewer than the /24
	// needs; the same option with the right octets is fine.
	for _, tc := range []struct {
		name   string
		octets []byte
		ok     bool
	}{{"3 octets for /24", []byte{10, 1, 0}, true}, {"4 octets for /24", []byte{10, 1, 0, 0}, false}, {"2 octets for /24", []byte{10, 1}, false}} {
		r := unpackedWithECS(t, 1, 24, tc.octets)
		if r == nil {
			if tc.ok {
				t.Errorf("%s: miekg/dns refused it", tc.name)
			}
			continue // miekg/dns refused it: CoreDNS answers FORMERR itself
		}
		_, err := queryECS(r)
		if (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

func ask2(t *testing.T, p *PgCluster, r *dns.Msg) *dns.Msg {
	t.Helper()
	rec := dnstest.NewRecorder(&test.ResponseWriter{})
	code, err := p.ServeDNS(context.Background(), rec, r)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Msg == nil {
		return &dns.Msg{MsgHdr: dns.MsgHdr{Rcode: code}}
	}
	return rec.Msg
}

// unpackedWithECS is a query for local.<zone> A received with an ECS
// option of family, source and the address octets given, as miekg/dns
// unpacks it; nil when it refuses to.
func unpackedWithECS(t testing.TB, family uint16, source uint8, octets []byte) *dns.Msg {
	r := new(dns.Msg)
	r.SetQuestion("local."+testZone, dns.TypeA)
	r.SetEdns0(1232, false)
	wire, err := r.Pack()
	if err != nil {
		t.Fatal(err)
	}
	// The OPT record is last: patch its RDLENGTH and append the option.
	opt := []byte{0, 8, 0, byte(4 + len(octets)), byte(family >> 8), byte(family), source, 0}
	opt = append(opt, octets...)
	if len(opt) > 255 {
		return nil
	}
	rdlen := len(wire) - 2
	wire[rdlen], wire[rdlen+1] = byte(len(opt)>>8), byte(len(opt))
	wire = append(wire, opt...)
	m := new(dns.Msg)
	if m.Unpack(wire) != nil {
		return nil
	}
	return m
}
