package pgcluster

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/health"
)

// FuzzBuild feeds arbitrary registry rows to the snapshot builder and asks
// the handler about them: nothing may panic, every CNAME must lead to a name
// that exists, and every answer must pack.
func FuzzBuild(f *testing.F) {
	f.Add("local", "pg1", "primary", "prod", "local", "myapp-db", "prod", uint8(1), uint8(1), []byte{192, 0, 2, 1}, int64(0), []byte{})
	f.Add("Local", "primary", "standby", "a", "a", "b", "nowhere", uint8(0), uint8(3), []byte{}, int64(-1), []byte{0x15, 0x2a})
	f.Add("x", "_bad", "unknown", "x", "y", "y", "x", uint8(255), uint8(0), []byte{255, 255, 255, 255}, int64(1<<62), []byte{0xff})
	f.Add(strings.Repeat("c", 63), strings.Repeat("n", 63), "Primary ", "a", "b", "b", strings.Repeat("c", 63), uint8(7), uint8(40), []byte{0xfe, 0x80, 15: 1}, int64(-1<<63), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Fuzz(func(t *testing.T, cluster, name, role, a1, t1, a2, t2 string, last, primaries uint8, addr []byte, age int64, checks []byte) {
		a, ok := netip.AddrFromSlice(addr)
		if !ok {
			a = netip.AddrFrom4([4]byte{192, 0, 2, last})
		}
		nodes := []Node{
			{Cluster: cluster, Name: name, Role: role, Address: a, Port: 5432, Healthy: true, HeartbeatAge: time.Duration(age)},
			{Cluster: cluster, Name: name + "2", Role: "standby", Address: netip.AddrFrom4([4]byte{127, 0, 0, last}), Port: 5432, Healthy: true},
		}
		// Split brain: many nodes claim to be primary.
		for i := range int(primaries % 40) {
			nodes = append(nodes, Node{Cluster: cluster, Name: fmt.Sprintf("%.55s%d", name, i), Role: "primary", Address: netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), Port: 5432, Healthy: true})
		}
		aliases := []Alias{{a1, t1}, {a2, t2}}
		// Checks: byte i judges node i (state, role, WAL) when present.
		set := &settings{zones: []string{testZone}, ttl: 5, staleAfter: 10 * time.Second, allDown: allDownOpen}
		var view health.View
		if len(checks) > 0 {
			set.check, set.maxLag = checkPostgres, 64
			if checks[0]&0x80 != 0 {
				set.allDown = allDownClosed
			}
			view = health.View{}
			for i, b := range checks {
				if i >= len(nodes) {
					break
				}
				n := nodes[i]
				view[strings.ToLower(n.Cluster)+"/"+strings.ToLower(n.Name)] = health.Verdict{
					State: health.State(b % 3), Role: []string{"", health.RolePrimary, health.RoleStandby}[b/3%3],
					WAL: uint64(b) * 50, Cause: "refused",
				}
			}
		}
		s := build(buildInput{settings: set, nodes: nodes, aliases: aliases, view: view})
		for owner, e := range s.names {
			if !strings.HasSuffix(owner, testZone) {
				t.Fatalf("owner %q outside the zone", owner)
			}
			if len(owner)+1 > 255 {
				t.Fatalf("owner %q is longer than 255 octets", owner)
			}
			if e.cname != nil && e.next == nil {
				t.Fatalf("CNAME at %q leads nowhere: %v", owner, e.cname)
			}
		}
		p := &PgCluster{Zones: []string{testZone}, ttl: 5, Next: test.ErrorHandler()}
		s.setSerial(1, 5)
		p.snap.Store(s)
		for owner := range s.names {
			for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeTXT, dns.TypeCNAME, dns.TypeNS, dns.TypeSOA, dns.TypeANY} {
				m := new(dns.Msg)
				m.SetQuestion(owner, qt)
				rec := dnstest.NewRecorder(&test.ResponseWriter{})
				if rcode, _ := p.ServeDNS(context.Background(), rec, m); rcode == dns.RcodeServerFailure || rec.Msg.Rcode == dns.RcodeServerFailure {
					t.Fatalf("%s %d: SERVFAIL for a name the zone holds", owner, qt)
				}
				if _, err := rec.Msg.Pack(); err != nil {
					t.Fatalf("%s %d: answer does not pack: %v", owner, qt, err)
				}
			}
		}
	})
}
