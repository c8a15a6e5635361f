package pgcluster

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
)

// FuzzBuild feeds arbitrary registry rows to the snapshot builder and asks
// the handler about them: nothing may panic, every CNAME must lead to a name
// that exists, and every answer must pack.
func FuzzBuild(f *testing.F) {
	f.Add("local", "pg1", "primary", "prod", "local", "myapp-db", "prod", uint8(1))
	f.Add("Local", "primary", "standby", "a", "a", "b", "nowhere", uint8(0))
	f.Add("x", "_bad", "unknown", "x", "y", "y", "x", uint8(255))
	f.Fuzz(func(t *testing.T, cluster, name, role, a1, t1, a2, t2 string, last uint8) {
		nodes := []Node{
			{Cluster: cluster, Name: name, Role: role, Address: netip.AddrFrom4([4]byte{192, 0, 2, last}), Port: 5432, Healthy: true},
			{Cluster: cluster, Name: name + "2", Role: "standby", Address: netip.AddrFrom4([4]byte{127, 0, 0, last}), Port: 5432, Healthy: true},
		}
		aliases := []Alias{{a1, t1}, {a2, t2}}
		s := build(buildInput{zones: []string{testZone}, nodes: nodes, aliases: aliases, ttl: 5})
		for owner, e := range s.names {
			if !strings.HasSuffix(owner, testZone) {
				t.Fatalf("owner %q outside the zone", owner)
			}
			if e.cname != nil && e.next == nil {
				t.Fatalf("CNAME at %q leads nowhere: %v", owner, e.cname)
			}
		}
		p := &PgCluster{Zones: []string{testZone}, ttl: 5, Next: test.ErrorHandler()}
		s.setSerial(1, 5)
		p.snap.Store(s)
		for owner := range s.names {
			for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeTXT} {
				m := new(dns.Msg)
				m.SetQuestion(owner, qt)
				rec := dnstest.NewRecorder(&test.ResponseWriter{})
				p.ServeDNS(context.Background(), rec, m)
				if _, err := rec.Msg.Pack(); err != nil {
					t.Fatalf("%s %d: answer does not pack: %v", owner, qt, err)
				}
			}
		}
	})
}
