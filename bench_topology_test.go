package pgcluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"
)

// BenchmarkTopology is the cost of one A query for the two-zone cluster
// through CoreDNS's ScrubWriter, with topology off, and with topology local
// and ECS on every query with 100 networks in 20 zones and with 10,000
// networks: the lookup walks the address's bits, never the networks, so
// the two local figures are alike.
func BenchmarkTopology(b *testing.B) {
	ctx := context.Background()
	nodes, _ := twoZones()
	networks := func(n int) []Network {
		out := make([]Network, n)
		for i := range out {
			out[i] = Network{Network: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24), Region: "r", Zone: fmt.Sprintf("z%d", i%20)}
		}
		if n > 0 {
			out[0].Zone = "a" // the client's network
		}
		return out
	}
	for _, tc := range []struct {
		name     string
		mode     string
		networks int
	}{{"off", topologyOff, 0}, {"local/100", topologyLocal, 100}, {"local/10000", topologyLocal, 10000}} {
		b.Run(tc.name, func(b *testing.B) {
			p := topologyPlugin(tc.mode, 1, nodes, networks(tc.networks), nil)
			r := new(dns.Msg)
			r.SetQuestion("local."+testZone, dns.TypeA)
			o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
			o.SetUDPSize(1232)
			o.Option = []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(10, 0, 0, 0).To4()}}
			r.Extra = []dns.RR{o}
			w := &packWriter{}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := p.ServeDNS(ctx, request.NewScrubWriter(r, w), r); err != nil {
					b.Fatal(err)
				}
			}
			if tc.mode == topologyLocal && len(w.msg.Answer) != 3 {
				b.Fatalf("answer %v", w.msg.Answer)
			}
		})
	}
}
