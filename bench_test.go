package pgcluster

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/file"
	"github.com/coredns/coredns/plugin/test"
	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"
)

// benchNodes is a cluster "local" of n IPv4 nodes.
func benchNodes(n int) []Node {
	nodes := make([]Node, n)
	for i := range nodes {
		role := "standby"
		if i == 0 {
			role = "primary"
		}
		nodes[i] = node("local", fmt.Sprintf("pg%d", i+1), benchAddr(i).String(), role)
	}
	return nodes
}

// benchAddr is the address of node i: 192.0.2.0/24 as far as it goes, then
// 10.0.0.0/8.
func benchAddr(i int) netip.Addr {
	if i < 254 {
		return netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})
	}
	return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
}

// fileZone is the same records as pgcluster serves for local.Z and its SRV
// name, as a zone for CoreDNS's file plugin.
func fileZone(b *testing.B, n int) file.File {
	var sb strings.Builder
	sb.WriteString("$TTL 5\n$ORIGIN pgcluster.lan.\n@ IN SOA ns.pgcluster.lan. hostmaster.pgcluster.lan. 1 3600 600 86400 5\n@ IN NS ns.pgcluster.lan.\n")
	for i := range n {
		fmt.Fprintf(&sb, "local IN A %s\n", benchAddr(i))
		fmt.Fprintf(&sb, "pg%d.local IN A %s\n", i+1, benchAddr(i))
		fmt.Fprintf(&sb, "_postgresql._tcp.local IN SRV 0 10 5432 pg%d.local\n", i+1)
	}
	z, err := file.Parse(strings.NewReader(sb.String()), testZone, "stdin", 0)
	if err != nil {
		b.Fatal(err)
	}
	return file.File{Next: test.ErrorHandler(), Zones: file.Zones{Z: map[string]*file.Zone{testZone: z}, Names: []string{testZone}}}
}

// packWriter packs each reply into a reused buffer, as the server does
// before it sends it.
type packWriter struct {
	test.ResponseWriter
	buf []byte
	msg *dns.Msg
}

func (w *packWriter) WriteMsg(m *dns.Msg) error {
	w.msg = m
	var err error
	w.buf, err = m.PackBuffer(w.buf)
	return err
}

// BenchmarkServeDNS compares pgcluster with CoreDNS's file plugin answering
// the same A and SRV records for local.pgcluster.lan., in the same run,
// through CoreDNS's ScrubWriter (truncation to the client's 512 octets over
// UDP, or 64 KB over TCP) and packing. With 10000 nodes pgcluster takes what
// fits; file builds the whole answer, and Truncate cuts it.
func BenchmarkServeDNS(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{3, 20, 10000} {
		p := newTestPlugin(buildInput{nodes: benchNodes(n)})
		f := fileZone(b, n)
		for _, tc := range []struct {
			name  string
			qtype uint16
			tcp   bool
		}{
			{"local.pgcluster.lan.", dns.TypeA, false},
			{"_postgresql._tcp.local.pgcluster.lan.", dns.TypeSRV, false},
			{"_postgresql._tcp.local.pgcluster.lan.", dns.TypeSRV, true},
		} {
			m := new(dns.Msg)
			m.SetQuestion(tc.name, tc.qtype)
			net := "udp"
			if tc.tcp {
				net = "tcp"
			}
			for _, h := range []plugin.Handler{p, f} {
				b.Run(fmt.Sprintf("%s/%s/%s/nodes=%d", h.Name(), dns.TypeToString[tc.qtype], net, n), func(b *testing.B) {
					pw := &packWriter{ResponseWriter: test.ResponseWriter{TCP: tc.tcp}}
					w := request.NewScrubWriter(m, pw)
					b.ReportAllocs()
					for b.Loop() {
						h.ServeDNS(ctx, w, m)
					}
					// 3 nodes fit any buffer, 20 fit TCP's.
					full := n == 3 || tc.tcp && n <= 20
					if got := len(pw.msg.Answer); got == 0 || got > n || full && got != n {
						b.Fatalf("%s answered %d records for %d nodes", h.Name(), got, n)
					}
				})
			}
		}
	}
}

// BenchmarkApply is the work a registry reload does after the query: build
// the snapshot, swap it in, update metrics.
func BenchmarkApply(b *testing.B) {
	for _, n := range []int{3, 200} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			p := &PgCluster{}
			pb := &publisher{p: p, set: &settings{zones: []string{testZone}, ttl: 5}}
			nodes := benchNodes(n)
			b.ReportAllocs()
			for b.Loop() {
				pb.apply(nodes, testAliases)
			}
		})
	}
}

// BenchmarkBuildScale is a whole-zone build at a provider's scale: nodes
// spread over clusters of ten, with an alias per cluster. Issue 9 guards
// that no quadratic path is left in building.
func BenchmarkBuildScale(b *testing.B) {
	for _, n := range []int{10000, 50000} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			clusters := n / 10
			nodes := make([]Node, n)
			for i := range nodes {
				role := "standby"
				if i%10 == 0 {
					role = "primary"
				}
				nodes[i] = node(fmt.Sprintf("c%d", i/10), fmt.Sprintf("n%d", i%10), benchAddr(i).String(), role)
			}
			aliases := make([]Alias, 0, 1000)
			for i := range 1000 {
				aliases = append(aliases, Alias{fmt.Sprintf("a%d", i), fmt.Sprintf("c%d", i*clusters/1000)})
			}
			set := &settings{zones: []string{testZone}, ttl: 5}
			b.ReportAllocs()
			for b.Loop() {
				build(buildInput{settings: set, nodes: nodes, aliases: aliases})
			}
		})
	}
}
