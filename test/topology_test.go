package test

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/coretest"
)

// topologyRegistry is cluster "main" of three nodes in zone a and three in
// zone b (region eu; checks off, so nothing connects to their addresses),
// and the networks of each zone's clients: 10.1.0.0/16 and the loopback
// addresses 127.0.0.64/26 in a, 10.2.0.0/16 in b.
const topologyRegistry = `
INSERT INTO pgcluster_nodes(cluster, name, address, role, region, zone) VALUES
  ('main', 'a1', '192.0.2.1', 'primary', 'eu', 'a'),
  ('main', 'a2', '192.0.2.2', 'standby', 'eu', 'a'),
  ('main', 'a3', '192.0.2.3', 'standby', 'eu', 'a'),
  ('main', 'b1', '192.0.2.4', 'standby', 'eu', 'b'),
  ('main', 'b2', '192.0.2.5', 'standby', 'eu', 'b'),
  ('main', 'b3', '192.0.2.6', 'standby', 'eu', 'b');
INSERT INTO pgcluster_networks(network, region, zone) VALUES
  ('10.1.0.0/16', 'eu', 'a'), ('127.0.0.64/26', 'eu', 'a'), ('10.2.0.0/16', 'eu', 'b');
INSERT INTO pgcluster_aliases VALUES ('prod', 'main');`

var zoneAddrs = map[string][]string{
	"a": {"192.0.2.1", "192.0.2.2", "192.0.2.3"},
	"b": {"192.0.2.4", "192.0.2.5", "192.0.2.6"},
}

// ecsQuery asks name's qtype of addr over UDP with an ECS option for
// subnet (none when ""), from the loopback source address src (any when
// ""), and returns the reply.
func ecsQuery(addr, name string, qtype uint16, subnet, src string) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
	o.SetUDPSize(1232)
	if subnet != "" {
		p := netip.MustParsePrefix(subnet)
		o.Option = []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: uint8(p.Bits()), Address: net.IP(p.Addr().AsSlice())}}
	}
	m.Extra = []dns.RR{o}
	c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
	if src != "" {
		c.Dialer = &net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.UDPAddr{IP: net.ParseIP(src)}}
	}
	r, _, err := c.Exchange(m, addr)
	return r, err
}

// scopeOf is a reply's ECS SCOPE PREFIX-LENGTH, -1 without ECS.
func scopeOf(m *dns.Msg) int {
	if o := m.IsEdns0(); o != nil {
		for _, opt := range o.Option {
			if s, ok := opt.(*dns.EDNS0_SUBNET); ok {
				return int(s.SourceScope)
			}
		}
	}
	return -1
}

// inOrder returns the A records' addresses as answered.
func inOrder(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		if a, ok := rr.(*dns.A); ok {
			out = append(out, a.A.String())
		}
	}
	return out
}

// placedAs checks that got is want's addresses first (in any order) then,
// with rest, rest's.
func placedAs(got []string, want, rest []string) error {
	if len(got) != len(want)+len(rest) {
		return fmt.Errorf("%v: want %v then %v", got, want, rest)
	}
	head, tail := slices.Sorted(slices.Values(got[:len(want)])), slices.Sorted(slices.Values(got[len(want):]))
	if !slices.Equal(head, want) || !slices.Equal(tail, rest) {
		return fmt.Errorf("%v: want %v then %v", got, want, rest)
	}
	return nil
}

// TestTopology runs bin/coredns with topology prefer and local against a
// real registry of two zones, three nodes each: ECS subnets of zone a's
// and zone b's networks get their own zone's nodes first (prefer) or only
// (local), with the network's prefix as the reply's scope, through the
// cluster's name, an alias and SRV; a query without ECS from a loopback
// source address in zone a's network gets zone a's answer; zone a's nodes
// all unhealthy send zone a's clients to zone b, and back when they
// return. A cache in the same server block stops start-up.
func TestTopology(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, topologyRegistry)
	start := func(mode string) *Instance {
		return StartFleetInstance(t, fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n errors\n pgcluster {\n  postgres %s\n  topology %s\n }\n}\n",
			Zone, PortPlaceholder, pg.DSN(""), mode))
	}
	prefer, local := start("prefer"), start("local")
	for _, tc := range []struct{ subnet, zone, other string }{{"10.1.7.0/24", "a", "b"}, {"10.2.9.0/24", "b", "a"}} {
		Eventually(t, 10*time.Second, func() error {
			r, err := ecsQuery(prefer.Addr(), "main."+Zone, dns.TypeA, tc.subnet, "")
			if err != nil {
				return err
			}
			if scopeOf(r) != 16 {
				return fmt.Errorf("prefer %s: scope %d, want 16", tc.subnet, scopeOf(r))
			}
			return placedAs(inOrder(r), zoneAddrs[tc.zone], zoneAddrs[tc.other])
		})
		for _, name := range []string{"main.", "prod."} {
			r, err := ecsQuery(local.Addr(), name+Zone, dns.TypeA, tc.subnet, "")
			if err != nil {
				t.Fatal(err)
			}
			if err := placedAs(inOrder(r), zoneAddrs[tc.zone], nil); err != nil || scopeOf(r) != 16 {
				t.Errorf("local %s%s from %s: %v, scope %d", name, Zone, tc.subnet, err, scopeOf(r))
			}
		}
		r, err := ecsQuery(prefer.Addr(), "_postgresql._tcp.main."+Zone, dns.TypeSRV, tc.subnet, "")
		if err != nil {
			t.Fatal(err)
		}
		var prios []string
		for _, rr := range r.Answer {
			srv := rr.(*dns.SRV)
			prios = append(prios, fmt.Sprintf("%s=%d", srv.Target[:1], srv.Priority))
		}
		if want := strings.Repeat(tc.zone+"=0 ", 3) + strings.Repeat(tc.other+"=10 ", 3); strings.Join(prios, " ")+" " != want {
			t.Errorf("prefer SRV from %s: %v, want %s", tc.subnet, prios, want)
		}
	}

	// Without ECS: the packet's source, 127.0.0.77, is in zone a's network.
	r, err := ecsQuery(local.Addr(), "main."+Zone, dns.TypeA, "", "127.0.0.77")
	if err != nil {
		t.Fatal(err)
	}
	if err := placedAs(inOrder(r), zoneAddrs["a"], nil); err != nil || scopeOf(r) != -1 {
		t.Errorf("local from source 127.0.0.77: %v, ECS in reply %d", err, scopeOf(r))
	}
	txt, err := ecsQuery(local.Addr(), "_client."+Zone, dns.TypeTXT, "", "127.0.0.77")
	if err != nil || len(txt.Answer) != 1 || !strings.Contains(txt.Answer[0].String(), `"address=127.0.0.77/32" "from=source" "network=127.0.0.64/26" "region=eu" "zone=a"`) {
		t.Errorf("_client from 127.0.0.77: %v %v", txt, err)
	}

	// Zone a's nodes all out: zone a's clients get zone b's, and back.
	pg.MustExec(t, "UPDATE pgcluster_nodes SET healthy = false WHERE zone = 'a'")
	for _, in := range []*Instance{prefer, local} {
		Eventually(t, 10*time.Second, func() error {
			r, err := ecsQuery(in.Addr(), "main."+Zone, dns.TypeA, "10.1.7.0/24", "")
			if err != nil {
				return err
			}
			return placedAs(inOrder(r), zoneAddrs["b"], nil)
		})
	}
	pg.MustExec(t, "UPDATE pgcluster_nodes SET healthy = true WHERE zone = 'a'")
	Eventually(t, 10*time.Second, func() error {
		r, err := ecsQuery(local.Addr(), "main."+Zone, dns.TypeA, "10.1.7.0/24", "")
		if err != nil {
			return err
		}
		return placedAs(inOrder(r), zoneAddrs["a"], nil)
	})
	// A network changed in the registry moves its clients.
	pg.MustExec(t, "UPDATE pgcluster_networks SET zone = 'b' WHERE network = '10.1.0.0/16'")
	Eventually(t, 10*time.Second, func() error {
		r, err := ecsQuery(local.Addr(), "main."+Zone, dns.TypeA, "10.1.7.0/24", "")
		if err != nil {
			return err
		}
		return placedAs(inOrder(r), zoneAddrs["b"], nil)
	})

	// cache in the block with topology on: start-up fails, saying why.
	bad := coretest.StartNoWait(t, coretest.Config{Binary: coreDNSBuild.Binary(t), StopTimeout: stopTimeout,
		Corefile: fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n cache\n pgcluster {\n  postgres %s\n  topology local\n }\n}\n", Zone, PortPlaceholder, pg.DSN(""))})
	select {
	case <-bad.Done():
	case <-time.After(20 * time.Second):
		t.Fatalf("bin/coredns with cache and topology local still runs; log:\n%s", bad.Log())
	}
	if !strings.Contains(bad.Log(), "the cache plugin of this server block answers before pgcluster") {
		t.Errorf("start-up with cache: %s; log:\n%s", bad.State(), bad.Log())
	}
}
