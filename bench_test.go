package pgcluster

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/coredns/coredns/plugin/file"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

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
		nodes[i] = node("local", fmt.Sprintf("pg%d", i+1), fmt.Sprintf("192.0.2.%d", i+1), role)
	}
	return nodes
}

// fileZone is the same records as pgcluster serves for local.Z, as a zone
// for CoreDNS's file plugin.
func fileZone(b *testing.B, n int) file.File {
	var sb strings.Builder
	sb.WriteString("$TTL 5\n$ORIGIN pgcluster.lan.\n@ IN SOA ns.pgcluster.lan. hostmaster.pgcluster.lan. 1 3600 600 86400 5\n@ IN NS ns.pgcluster.lan.\n")
	for i := range n {
		fmt.Fprintf(&sb, "local IN A 192.0.2.%d\n", i+1)
	}
	z, err := file.Parse(strings.NewReader(sb.String()), testZone, "stdin", 0)
	if err != nil {
		b.Fatal(err)
	}
	return file.File{Next: test.ErrorHandler(), Zones: file.Zones{Z: map[string]*file.Zone{testZone: z}, Names: []string{testZone}}}
}

// BenchmarkServeDNS compares pgcluster with CoreDNS's file plugin answering
// the same A records for local.pgcluster.lan., in the same run.
func BenchmarkServeDNS(b *testing.B) {
	for _, n := range []int{3, 20} {
		m := new(dns.Msg)
		m.SetQuestion("local.pgcluster.lan.", dns.TypeA)
		ctx := context.Background()

		b.Run(fmt.Sprintf("pgcluster/nodes=%d", n), func(b *testing.B) {
			p := newTestPlugin(buildInput{nodes: benchNodes(n)})
			rec := dnstest.NewRecorder(&test.ResponseWriter{})
			b.ReportAllocs()
			for b.Loop() {
				p.ServeDNS(ctx, rec, m)
			}
			if len(rec.Msg.Answer) != n {
				b.Fatalf("pgcluster answered %d records, want %d", len(rec.Msg.Answer), n)
			}
		})
		b.Run(fmt.Sprintf("file/nodes=%d", n), func(b *testing.B) {
			f := fileZone(b, n)
			rec := dnstest.NewRecorder(&test.ResponseWriter{})
			b.ReportAllocs()
			for b.Loop() {
				f.ServeDNS(ctx, rec, m)
			}
			if len(rec.Msg.Answer) != n {
				b.Fatalf("file answered %d records, want %d", len(rec.Msg.Answer), n)
			}
		})
	}
}

// BenchmarkApply is the work a registry reload does after the query: build
// the snapshot, swap it in, update metrics.
func BenchmarkApply(b *testing.B) {
	for _, n := range []int{3, 200} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			p := &PgCluster{}
			pb := &publisher{p: p, zones: []string{testZone}, ttl: 5}
			nodes := benchNodes(n)
			b.ReportAllocs()
			for b.Loop() {
				pb.apply(nodes, testAliases)
			}
		})
	}
}
