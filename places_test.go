package pgcluster

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// With 10.0.0.0/16 in a and 10.0.5.0/24 in b, a client in 10.0.1.x is in
// a, with a scope that leaves 10.0.5.0/24 out; one in 10.0.5.x in b with
// the network's own prefix; one outside both unmapped, with a scope that
// leaves both out; and SOURCE 0 is unmapped, scope 0.
func TestPlaceMapOverlap(t *testing.T) {
	pm := newPlaceMap([]Network{
		{Network: netip.MustParsePrefix("10.0.0.0/16"), Zone: "a"},
		{Network: netip.MustParsePrefix("10.0.5.0/24"), Zone: "b"},
		{Network: netip.MustParsePrefix("2001:db8::/56"), Zone: "b"},
	})
	for _, tc := range []struct {
		addr    string
		bits    int
		network string
		zone    string
		scope   int
	}{
		{"10.0.1.7", 32, "10.0.0.0/16", "a", 22},
		{"10.0.1.0", 24, "10.0.0.0/16", "a", 22},
		{"10.0.200.0", 24, "10.0.0.0/16", "a", 17},
		{"10.0.5.9", 32, "10.0.5.0/24", "b", 24},
		{"10.0.5.0", 24, "10.0.5.0/24", "b", 24},
		{"10.0.4.0", 23, "10.0.0.0/16", "a", 23}, // a /23 that holds b's /24: as fine as the source allows
		{"10.1.0.0", 16, "", "", 16},
		{"192.0.2.1", 32, "", "", 1},
		{"0.0.0.0", 0, "", "", 0},
		{"2001:db8::1", 128, "2001:db8::/56", "b", 56},
		{"2001:db9::", 56, "", "", 32},
	} {
		n, id, scope := pm.lookup(netip.MustParseAddr(tc.addr), tc.bits)
		got := ""
		if n >= 0 {
			got = pm.networks[n].Network.String()
		}
		if got != tc.network || pm.places[id].zone != tc.zone || scope != tc.scope {
			t.Errorf("%s/%d: network %q zone %q scope %d, want %q %q %d", tc.addr, tc.bits, got, pm.places[id].zone, scope, tc.network, tc.zone, tc.scope)
		}
	}
	// A family without networks: every client alike.
	if n, id, scope := newPlaceMap(nil).lookup(netip.MustParseAddr("10.0.0.1"), 32); n != -1 || id != 0 || scope != 0 {
		t.Errorf("no networks: %d %d %d", n, id, scope)
	}
}

// Random overlapping networks: the trie's longest match is a scan's, and
// its scope is the shortest prefix around the address that holds no
// network placed otherwise than the prefix itself, found by brute force.
func TestPlaceMapMatchesScan(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	zones := []string{"", "a", "b"}
	for round := range 50 {
		var nets []Network
		seen := map[netip.Prefix]bool{}
		for range 1 + rnd.IntN(30) {
			a := netip.AddrFrom4([4]byte{10, byte(rnd.IntN(4)), byte(rnd.IntN(256)), byte(rnd.IntN(256))})
			p := netip.PrefixFrom(a, 8+rnd.IntN(21)).Masked()
			if !seen[p] {
				seen[p] = true
				nets = append(nets, Network{Network: p, Zone: zones[rnd.IntN(len(zones))]})
			}
		}
		pm := newPlaceMap(nets)
		longest := func(b netip.Prefix) (Network, bool) {
			var best Network
			ok := false
			for _, n := range nets {
				if n.Network.Bits() <= b.Bits() && n.Network.Contains(b.Addr()) && (!ok || n.Network.Bits() > best.Network.Bits()) {
					best, ok = n, true
				}
			}
			return best, ok
		}
		for range 200 {
			bits := 32
			if rnd.IntN(2) == 0 {
				bits = 24
			}
			a := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(rnd.IntN(5)), byte(rnd.IntN(256)), byte(rnd.IntN(256))}), bits).Masked().Addr()
			want, ok := longest(netip.PrefixFrom(a, bits))
			n, id, scope := pm.lookup(a, bits)
			if ok != (n >= 0) || ok && pm.networks[n].Network != want.Network || pm.places[id].zone != want.Zone {
				t.Fatalf("round %d: %s/%d: network %d zone %q, want %v (%v)", round, a, bits, n, pm.places[id].zone, want, ok)
			}
			wantScope := bits
			for l := 0; l <= bits; l++ {
				b := netip.PrefixFrom(a, l).Masked()
				eff, _ := longest(b)
				uniform := true
				for _, o := range nets {
					if o.Network.Bits() > l && b.Contains(o.Network.Addr()) && o.Zone != eff.Zone {
						uniform = false
					}
				}
				if uniform {
					wantScope = l
					break
				}
			}
			if scope != wantScope {
				t.Fatalf("round %d: %s/%d: scope %d, want %d (networks %v)", round, a, bits, scope, wantScope, nets)
			}
		}
	}
}

// A network whose region or zone is not a DNS label is skipped, and says why.
func TestPlaceMapSkipsBadPlace(t *testing.T) {
	pm := newPlaceMap([]Network{{Network: netip.MustParsePrefix("10.0.0.0/8"), Zone: "not a label"}})
	if len(pm.networks) != 0 || len(pm.skipped) != 1 || pm.skipped[0].reason != skipInvalidPlace {
		t.Errorf("networks %v skipped %v", pm.networks, pm.skipped)
	}
}

// A node's region and zone show in its TXT record; one that is not a DNS
// label is ignored (the node served without it), said in TXT and skipped
// rows.
func TestNodePlaceTXT(t *testing.T) {
	good := node("local", "pg1", "192.0.2.1", "primary")
	good.Region, good.Zone = "EU", "eu-a"
	bad := node("local", "pg2", "192.0.2.2", "standby")
	bad.Region, bad.Zone = "eu", "eu a"
	s := build(buildInput{settings: &settings{zones: []string{testZone}, ttl: 5}, nodes: []Node{good, bad}})
	txt := func(name string) string { return strings.Join(entryOf(s, name+".local."+testZone).txt.Txt, " ") }
	if got := txt("pg1"); !strings.Contains(got, "region=eu zone=eu-a") || strings.Contains(got, "place_ignored") {
		t.Errorf("pg1 TXT %q", got)
	}
	if got := txt("pg2"); !strings.Contains(got, "region=eu") || strings.Contains(got, "zone=") || !strings.Contains(got, `place_ignored=zone ?eu a? is not a DNS label`) || !strings.Contains(got, "state=in") {
		t.Errorf("pg2 TXT %q", got)
	}
	if sk := allSkipped(s); len(sk) != 1 || sk[0].reason != skipInvalidPlace || s.skips[skipInvalidPlace] != 1 {
		t.Errorf("skipped %v, skips %v", sk, s.skips)
	}
}

// A place that is not a DNS label is logged once, when the row first has
// it: a node's as ignored (the node is served), a network's as skipped.
func TestBadPlaceLoggedOnce(t *testing.T) {
	buf := captureLog(t)
	bad := node("local", "pg1", "192.0.2.1", "primary")
	bad.Zone = "a b"
	pb := newPublisher(&settings{zones: []string{testZone}, ttl: 5}, nil, false)
	nets := []Network{{Network: netip.MustParsePrefix("10.0.0.0/8"), Region: "r_1"}}
	for range 2 {
		pb.applyAt(rowsUpdate{nodes: groupNodes([]Node{bad}), full: true, aliasesSet: true, networks: nets, networksSet: true, loadedAt: time.Now()})
	}
	text := buf.String()
	for _, want := range []string{`Registry row's place ignored: zone "a b" is not a DNS label of node "pg1" in cluster "local": served without it (invalid_place)`,
		`Registry row skipped, not served: network 10.0.0.0/8: region "r_1" is not a DNS label (invalid_place)`} {
		if n := strings.Count(text, want); n != 1 {
			t.Errorf("logged %d times, want once: %s\n%s", n, want, text)
		}
	}
}

// With topology on, a place whose last serving node goes is logged once,
// and once more when it serves again.
func TestPlaceWidensLogged(t *testing.T) {
	buf := captureLog(t)
	nodes, _ := twoZones()
	pb := newPublisher(&settings{zones: []string{testZone}, ttl: 5, topology: topologyLocal, minLocal: 1}, nil, false)
	apply := func(healthyA bool) {
		ns := slices.Clone(nodes)
		for i := range 3 {
			ns[i].Healthy = healthyA
		}
		pb.applyAt(rowsUpdate{nodes: groupNodes(ns), full: true, aliasesSet: true, loadedAt: time.Now()})
	}
	apply(true)
	apply(false)
	apply(false)
	apply(true)
	text := buf.String()
	for _, want := range []string{`Cluster "local": region r zone a has no serving node: its clients get the nearest nodes elsewhere (topology local)`,
		`Cluster "local": region r zone a serves again (3 nodes): its clients get them first`} {
		if n := strings.Count(text, want); n != 1 {
			t.Errorf("logged %d times, want once: %s\n%s", n, want, text)
		}
	}
	if strings.Contains(text, "zone b") {
		t.Errorf("zone b never changed:\n%s", text)
	}
}
