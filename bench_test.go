package pgcluster

import (
	"context"
	"fmt"
	"github.com/pgcluster/pgcluster/health"
	"net/netip"
	"slices"
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
			pb := newPublisher(&settings{zones: []string{testZone}, ttl: 5}, nil, false)
			nodes := benchNodes(n)
			b.ReportAllocs()
			for b.Loop() {
				pb.apply(nodes, testAliases)
			}
		})
	}
}

// scaleRows is a provider's registry: n nodes in clusters of n/clusters,
// the first of each the primary, and an alias to every clusters/aliases-th
// cluster.
func scaleRows(n, clusters, aliases int) ([]Node, []Alias) {
	nodes := make([]Node, n)
	per := n / clusters
	for i := range nodes {
		role := "standby"
		if i%per == 0 {
			role = "primary"
		}
		nodes[i] = node(fmt.Sprintf("c%d", i/per), fmt.Sprintf("n%d", i%per), benchAddr(i).String(), role)
	}
	as := make([]Alias, 0, aliases)
	for i := range aliases {
		as = append(as, Alias{Alias: fmt.Sprintf("a%d", i), Target: fmt.Sprintf("c%d", i*clusters/aliases)})
	}
	return nodes, as
}

// BenchmarkBuildScale is a whole-zone build at a provider's scale (what a
// first load does): nodes in clusters of ten, with an alias per ten clusters
// (1,000 clusters) or per cluster (5,000). It shows a quadratic path in
// building as a time per node that grows from 10,000 to 50,000 nodes.
func BenchmarkBuildScale(b *testing.B) {
	for _, sc := range []struct{ n, clusters, aliases int }{{10000, 1000, 1000}, {50000, 1000, 1000}, {50000, 5000, 5000}} {
		b.Run(fmt.Sprintf("nodes=%d/clusters=%d/aliases=%d", sc.n, sc.clusters, sc.aliases), func(b *testing.B) {
			nodes, aliases := scaleRows(sc.n, sc.clusters, sc.aliases)
			set := &settings{zones: []string{testZone}, ttl: 5}
			b.ReportAllocs()
			for b.Loop() {
				build(buildInput{settings: set, nodes: nodes, aliases: aliases})
			}
		})
	}
}

// BenchmarkChangeScale is what one change costs at a provider's scale: a
// node of one cluster changes role (its cluster is built again, the rest is
// shared), or an alias is added (the aliases are resolved again).
func BenchmarkChangeScale(b *testing.B) {
	for _, sc := range []struct{ n, clusters, aliases int }{{100, 10, 1}, {10000, 1000, 1000}, {50000, 1000, 1000}, {50000, 5000, 5000}} {
		nodes, aliases := scaleRows(sc.n, sc.clusters, sc.aliases)
		set := &settings{zones: []string{testZone}, ttl: 5}
		s := build(buildInput{settings: set, nodes: nodes, aliases: aliases})
		rows := groupNodes(nodes)["c0"]
		b.Run(fmt.Sprintf("cluster/nodes=%d/clusters=%d/aliases=%d", sc.n, sc.clusters, sc.aliases), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				rows = slices.Clone(rows)
				rows[0].Role, rows[1].Role = rows[1].Role, rows[0].Role
				s = s.next(change{rowsUpdate: rowsUpdate{nodes: map[string][]Node{"c0": rows}}})
			}
		})
		b.Run(fmt.Sprintf("verdict/nodes=%d/clusters=%d/aliases=%d", sc.n, sc.clusters, sc.aliases), func(b *testing.B) {
			// A node's check verdict flips: every instance makes this
			// change for each flip the fleet publishes. Only its cluster
			// is built again, found from the View's changes (not by
			// comparing every verdict).
			cset := *set
			cset.check, cset.allDown = checkTCP, allDownClosed
			verdicts := map[string]health.Verdict{}
			for _, n := range nodes {
				verdicts[n.Cluster+"/"+n.Name] = health.Verdict{State: health.Up, Cause: health.CauseOK}
			}
			view := health.ViewOf(verdicts)
			s := build(buildInput{settings: &cset, nodes: nodes, aliases: aliases, view: view})
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				n := nodes[i%len(nodes)]
				e := view.Edit()
				v := health.Verdict{State: health.Down, Cause: health.CauseRefused}
				if i/len(nodes)%2 == 1 {
					v = health.Verdict{State: health.Up, Cause: health.CauseOK}
				}
				e.Set(n.Cluster+"/"+n.Name, v)
				view = e.View()
				s = s.next(change{view: view, viewSet: true})
				if len(s.rebuilt) != 1 {
					b.Fatalf("a verdict of one node rebuilt %d clusters", len(s.rebuilt))
				}
			}
		})
		b.Run(fmt.Sprintf("alias/nodes=%d/clusters=%d/aliases=%d", sc.n, sc.clusters, sc.aliases), func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				as := append(slices.Clone(aliases), Alias{Alias: "new", Target: fmt.Sprintf("c%d", i%sc.clusters)})
				s = s.next(change{rowsUpdate: rowsUpdate{aliases: as, aliasesSet: true}})
			}
		})
	}
}
