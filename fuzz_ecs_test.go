package pgcluster

import (
	"context"
	"net/netip"
	"testing"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"
)

// FuzzECS sends queries whose EDNS Client Subnet option holds any family,
// source and scope prefix lengths and address octets, received as miekg/dns
// unpacks them, to a topology local zone through CoreDNS's ScrubWriter.
// Nothing may panic; a malformed option is FORMERR and nothing else is;
// any other reply packs, echoes FAMILY, SOURCE PREFIX-LENGTH and ADDRESS,
// and has a SCOPE PREFIX-LENGTH within the family's bits, 0 for SOURCE 0.
func FuzzECS(f *testing.F) {
	f.Add(uint16(1), uint8(24), uint8(0), []byte{10, 1, 7}, uint8(0))
	f.Add(uint16(1), uint8(24), uint8(0), []byte{10, 1, 7, 0}, uint8(1))
	f.Add(uint16(1), uint8(33), uint8(0), []byte{10, 1, 7, 0, 0}, uint8(2))
	f.Add(uint16(2), uint8(56), uint8(0), []byte{0x20, 0x01, 0x0d, 0xb8, 0, 0, 0}, uint8(3))
	f.Add(uint16(0), uint8(0), uint8(0), []byte{}, uint8(4))
	f.Add(uint16(1), uint8(16), uint8(0), []byte{10, 1, 1}, uint8(5))
	f.Add(uint16(7), uint8(8), uint8(9), []byte{1}, uint8(6))
	nodes, networks := twoZones()
	networks = append(networks, Network{Network: netip.MustParsePrefix("10.1.5.0/24"), Region: "r", Zone: "b"},
		Network{Network: netip.MustParsePrefix("2001:db8::/56"), Region: "r", Zone: "a"})
	p := topologyPlugin(topologyLocal, 1, nodes, networks, []Alias{{Alias: "prod", Target: "local"}})
	names := []string{"local.", "prod.", "_postgresql._tcp.local.", "pg1.local.", "_client.", "nx."}
	types := []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeTXT}
	f.Fuzz(func(t *testing.T, family uint16, source, scope uint8, octets []byte, pick uint8) {
		if len(octets) > 64 {
			return
		}
		r := unpackedWithECS(t, family, source, octets)
		if r == nil {
			return // miekg/dns refuses it: CoreDNS answers FORMERR before any plugin
		}
		r.Question[0].Name = names[int(pick)%len(names)] + testZone
		r.Question[0].Qtype = types[int(pick/8)%len(types)]
		if o := r.IsEdns0(); o != nil {
			for _, opt := range o.Option {
				if s, ok := opt.(*dns.EDNS0_SUBNET); ok {
					s.SourceScope = scope
				}
			}
		}
		ecs, bad := queryECS(r)
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		w := request.NewScrubWriter(r, rec)
		code, err := p.ServeDNS(context.Background(), w, r)
		if err != nil {
			t.Fatal(err)
		}
		if bad != nil {
			if code != dns.RcodeFormatError || rec.Msg != nil {
				t.Fatalf("%v: rcode %d, reply %v; want FORMERR", bad, code, rec.Msg)
			}
			return
		}
		if rec.Msg == nil {
			t.Fatalf("no reply, rcode %d", code)
		}
		if _, err := rec.Msg.Pack(); err != nil {
			t.Fatalf("reply does not pack: %v", err)
		}
		if ecs == nil {
			return
		}
		var got *dns.EDNS0_SUBNET
		if o := rec.Msg.IsEdns0(); o != nil {
			for _, opt := range o.Option {
				if s, ok := opt.(*dns.EDNS0_SUBNET); ok {
					if got != nil {
						t.Fatal("two ECS options in the reply")
					}
					got = s
				}
			}
		}
		if got == nil || got.Family != ecs.Family || got.SourceNetmask != ecs.SourceNetmask || !got.Address.Equal(ecs.Address) {
			t.Fatalf("reply ECS %v, query's %v", got, ecs)
		}
		limit := uint8(32)
		if ecs.Family == ecsFamilyIPv6 {
			limit = 128
		}
		if got.SourceScope > limit || ecs.SourceNetmask == 0 && got.SourceScope != 0 {
			t.Fatalf("scope %d for source %d", got.SourceScope, ecs.SourceNetmask)
		}
	})
}
