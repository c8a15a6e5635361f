package pgcluster

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"
	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"
)

// bigNodes is a cluster of n nodes, every seventh on IPv6, with node names
// of varying length.
func bigNodes(cluster string, n int) []Node {
	nodes := make([]Node, n)
	for i := range nodes {
		addr := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		if i%7 == 3 {
			addr = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)})
		}
		role := roleStandby
		if i == 0 {
			role = rolePrimary
		}
		nodes[i] = Node{Cluster: cluster, Name: fmt.Sprintf("n%d%s", i, strings.Repeat("x", i%13)), Address: addr, Port: 5432 + i%3, Role: role, Healthy: true}
	}
	return nodes
}

// bigPlugin serves clusters c3, c30, c200 and c10000, the alias big ->
// c10000, and a chain of 8 aliases with long names, deep-chain-alias-01 ->
// ... -> deep-chain-alias-08 -> c30.
func bigPlugin() *PgCluster {
	var nodes []Node
	for _, n := range []int{3, 30, 200, 10000} {
		nodes = append(nodes, bigNodes(fmt.Sprintf("c%d", n), n)...)
	}
	aliases := []Alias{{Alias: "big", Target: "c10000"}, {Alias: "deep-chain-alias-08", Target: "c30"}}
	for i := 1; i < 8; i++ {
		aliases = append(aliases, Alias{Alias: fmt.Sprintf("deep-chain-alias-%02d", i), Target: fmt.Sprintf("deep-chain-alias-%02d", i+1)})
	}
	return newTestPlugin(buildInput{nodes: nodes, aliases: aliases})
}

// hostileWriter does to a reply what CoreDNS's own writers may do before
// the ScrubWriter sends it: the cache plugin rewrites every TTL in place,
// loadbalance shuffles the answer in place, and any plugin may append.
type hostileWriter struct {
	dns.ResponseWriter
}

func (w hostileWriter) WriteMsg(m *dns.Msg) error {
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			rr.Header().Ttl = 0
		}
		slices.Reverse(sec)
	}
	// Appending into whatever capacity the sections have left.
	txt := &dns.TXT{Hdr: dns.RR_Header{Name: "x.", Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: []string{"appended"}}
	m.Answer = append(m.Answer, txt)
	m.Ns = append(m.Ns, txt)
	m.Extra = append(m.Extra, txt)
	m.Answer, m.Ns, m.Extra = m.Answer[:len(m.Answer)-1], m.Ns[:len(m.Ns)-1], m.Extra[:len(m.Extra)-1]
	return w.ResponseWriter.WriteMsg(m)
}

// fingerprint lists every record of the snapshot, and where each alias's
// names point.
func fingerprint(s *snapshot) string {
	var sb strings.Builder
	all := owners(s)
	names := make([]string, 0, len(all))
	for name := range all {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		o := all[name]
		if o.alias != nil {
			fmt.Fprintf(&sb, "%s alias %s %s ent=%t\n", name, o.alias.target, o.alias.final, o.e.ent)
			continue
		}
		e := o.e
		var soa *dns.SOA
		var ns []dns.RR
		if e.apex != nil {
			soa, ns = e.apex.soa, e.apex.ns
		}
		fmt.Fprintf(&sb, "%s %v ent=%t open=%t\n", name, soa, e.ent, e.failOpen)
		a, aaaa, srv, extra := records(e)
		var txt []dns.RR
		if e.txt != nil {
			txt = []dns.RR{e.txt}
		}
		for _, sec := range [][]dns.RR{a, aaaa, txt, srv, extra, ns} {
			fmt.Fprintf(&sb, "%d:", len(sec))
			for _, rr := range sec {
				sb.WriteString(rr.String())
				sb.WriteByte('|')
			}
			sb.WriteByte('\n')
		}
	}
	return sb.String()
}

// ask is a question, asked with an EDNS0 buffer of size octets (0: no
// EDNS0), over TCP or UDP.
type ask struct {
	name  string
	qtype uint16
	size  uint16
	tcp   bool
}

func (q ask) String() string {
	net := "udp"
	if q.tcp {
		net = "tcp"
	}
	return fmt.Sprintf("%s %s edns=%d %s", q.name, dns.TypeToString[q.qtype], q.size, net)
}

func (q ask) msg() *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(q.name, q.qtype)
	if q.size > 0 {
		m.SetEdns0(q.size, false)
	}
	return m
}

// serve asks p through CoreDNS's writer chain: the ScrubWriter (OPT record,
// Truncate) last, as the server sets it up, and returns what pgcluster wrote
// (before the writers) and what the client gets. The writer that keeps what
// pgcluster wrote is not one pgcluster knows to only read, so that answer
// holds copies; serve asks again through writers it knows (the log
// plugin's recorder over the ScrubWriter), which share the snapshot's
// records, and checks that the client gets the same. Asked alone (not
// hostile), the second answer starts from the same rotation and must be
// the same reply; hostile writers run concurrently, so there an address
// answer must have as many records in each section (addresses are all of
// one length, SRV targets are not, so SRV counts depend on the rotation).
func serve(t testing.TB, p *PgCluster, q ask, hostile bool) (wrote, got *dns.Msg) {
	t.Helper()
	start := p.rotate.Load()
	r := q.msg()
	client := dnstest.NewRecorder(&test.ResponseWriter{TCP: q.tcp})
	var w dns.ResponseWriter = request.NewScrubWriter(r, client)
	if hostile {
		w = hostileWriter{w}
	}
	rec := &copyWriter{ResponseWriter: w}
	if _, err := p.ServeDNS(context.Background(), rec, r); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	if !hostile {
		p.rotate.Store(start)
	}
	r2 := q.msg()
	r2.Id = r.Id
	client2 := dnstest.NewRecorder(&test.ResponseWriter{TCP: q.tcp})
	if _, err := p.ServeDNS(context.Background(), dnstest.NewRecorder(request.NewScrubWriter(r2, client2)), r2); err != nil {
		t.Fatalf("%s, shared records: %v", q, err)
	}
	switch {
	case client2.Msg == nil:
		t.Fatalf("%s, shared records: no reply", q)
	case hostile && (q.qtype == dns.TypeA || q.qtype == dns.TypeAAAA) && counts(client2.Msg) != counts(rec.msg):
		t.Fatalf("%s: %v records with shared records, %v with copies", q, counts(client2.Msg), counts(rec.msg))
	case !hostile && !samePacked(client2.Msg, client.Msg):
		t.Fatalf("%s: with shared records\n%s\nwith copies\n%s", q, client2.Msg, client.Msg)
	}
	return rec.msg, client.Msg
}

// samePacked reports whether a and b pack to the same octets (String takes
// far longer on answers of thousands of records).
func samePacked(a, b *dns.Msg) bool {
	pa, errA := a.Pack()
	pb, errB := b.Pack()
	return errA == nil && errB == nil && bytes.Equal(pa, pb)
}

// copyWriter keeps a copy of the message as it was written.
type copyWriter struct {
	dns.ResponseWriter
	msg *dns.Msg
}

func (w *copyWriter) WriteMsg(m *dns.Msg) error {
	w.msg = m.Copy()
	return w.ResponseWriter.WriteMsg(m)
}

// Nothing reachable from the snapshot may be handed to a writer; CoreDNS's
// writers append OPT records, truncate in place and rewrite TTLs. Run with
// -race: queries run concurrently.
func TestAnswerLeavesSnapshotAlone(t *testing.T) {
	p := bigPlugin()
	before := fingerprint(p.snapshot())
	var queries []ask
	for _, name := range []string{"_postgresql._tcp.c30.pgcluster.lan.", "_postgresql._tcp.c200.pgcluster.lan.",
		"_postgresql._tcp.big.pgcluster.lan.", "c200.pgcluster.lan.", "big.pgcluster.lan.", "n3xxx.c30.pgcluster.lan.",
		"c3.pgcluster.lan.", "pgcluster.lan.", "nope.pgcluster.lan."} {
		for _, qt := range []uint16{dns.TypeSRV, dns.TypeA, dns.TypeAAAA, dns.TypeTXT, dns.TypeNS, dns.TypeSOA, dns.TypeCNAME} {
			for _, size := range []uint16{0, 512, 1232, 4096} {
				queries = append(queries, ask{name, qt, size, false}, ask{name, qt, size, true})
			}
		}
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 3 * len(queries) {
				serve(t, p, queries[(i+g*7)%len(queries)], true)
			}
		})
	}
	wg.Wait()
	if after := fingerprint(p.snapshot()); after != before {
		t.Fatalf("the writers changed the snapshot:\n%s", firstDiff(before, after))
	}
	// And the answer is still right: every SRV target once, with its glue.
	_, got := serve(t, p, ask{"_postgresql._tcp.c200.pgcluster.lan.", dns.TypeSRV, 0, true}, false)
	if err := checkGlue(got); err != nil {
		t.Fatal(err)
	}
	if len(got.Answer) != 200 {
		t.Fatalf("TCP SRV answer of a 200-node cluster has %d records, want 200", len(got.Answer))
	}
}

func firstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\nbefore: %.300s\nafter:  %.300s", i, al[i], bl[i])
		}
	}
	return "different number of lines"
}

// checkGlue checks an SRV answer: one glue record per SRV record, for its
// target, no duplicates, and an OPT record only at the end.
func checkGlue(m *dns.Msg) error {
	targets := map[string]int{}
	var srvs []string
	for _, rr := range m.Answer {
		if srv, ok := rr.(*dns.SRV); ok {
			targets[srv.Target]++
			srvs = append(srvs, srv.Target)
		}
	}
	glue := map[string]int{}
	for i, rr := range m.Extra {
		switch rr.(type) {
		case *dns.OPT:
			if i != len(m.Extra)-1 {
				return fmt.Errorf("OPT record at %d of %d in the additional section", i, len(m.Extra))
			}
		case *dns.A, *dns.AAAA:
			glue[rr.Header().Name]++
		default:
			return fmt.Errorf("unexpected additional record %v", rr)
		}
	}
	for target, n := range targets {
		if n != 1 {
			return fmt.Errorf("SRV target %s appears %d times", target, n)
		}
		if glue[target] != 1 {
			return fmt.Errorf("SRV target %s has %d glue records, want 1", target, glue[target])
		}
	}
	if len(glue) != len(targets) {
		return fmt.Errorf("%d glue owners for %d SRV targets", len(glue), len(targets))
	}
	return nil
}

// An answer takes as many records as fit the client's buffer, never more
// (CoreDNS's Truncate then has nothing to cut), and not much fewer; TC is set
// over UDP when records were left out, never over TCP.
func TestAnswerFitsBuffer(t *testing.T) {
	p := bigPlugin()
	snap := p.snapshot()
	for _, name := range []string{"c3", "c30", "c200", "c10000", "C200", "big", "primary.big", "standby.c10000", "n3xxx.c30",
		"deep-chain-alias-01", "primary.deep-chain-alias-01", "DEEP-chain-alias-02"} {
		for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV} {
			for _, size := range []uint16{0, 512, 1232, 4096, 65535} {
				for _, tcp := range []bool{false, true} {
					qname := name + "." + testZone
					if qt == dns.TypeSRV {
						qname = labelSRV + "." + qname
					}
					q := ask{qname, qt, size, tcp}
					wrote, got := serve(t, p, q, false)
					if err := checkFit(snap, q, wrote, got); err != nil {
						t.Errorf("%s: %v", q, err)
					}
				}
			}
		}
	}
}

// checkFit checks the reply to q: wrote is what pgcluster wrote, got what the
// client received through the ScrubWriter.
func checkFit(snap *snapshot, q ask, wrote, got *dns.Msg) error {
	buf := min(max(int(q.size), dns.MinMsgSize), maxUDP)
	if q.tcp {
		buf = dns.MaxMsgSize
	}
	c := got.Copy()
	c.Compress = true
	if l := c.Len(); l > buf {
		return fmt.Errorf("reply of %d octets for a buffer of %d", l, buf)
	}
	// How many records the name has, and how many came.
	e, cnames, total := lookup(snap, q)
	if e == nil {
		return nil
	}
	opt, optLen := 0, 0
	if o := got.IsEdns0(); o != nil {
		opt, optLen = 1, dns.Len(o)
	}
	if len(got.Answer) != len(wrote.Answer) || len(got.Extra) != len(wrote.Extra)+opt {
		// Only a CNAME chain too long for the buffer by itself may be cut.
		chain := wrote.Copy()
		chain.Compress = true
		if len(wrote.Answer) > cnames || chain.Len()+optLen <= buf || !got.Truncated {
			return fmt.Errorf("Truncate cut the reply: %d/%d answer and %d/%d additional records kept, TC=%t", len(got.Answer), len(wrote.Answer), len(got.Extra), len(wrote.Extra)+opt, got.Truncated)
		}
		return nil
	}
	if err := checkGlue(got); err != nil {
		return err
	}
	n := len(got.Answer) - cnames
	if n == 0 && total > 0 {
		// Nothing came: then not even the smallest record fitted after the CNAMEs.
		smallest := map[uint16]int{dns.TypeA: 16, dns.TypeAAAA: 28}[q.qtype]
		if q.qtype == dns.TypeSRV {
			smallest = 18 + nameLen(e.srv[0].target) + 16
		}
		if l := c.Len() + smallest; l <= buf {
			return fmt.Errorf("no record of %d, though one fitted (%d of %d octets)", total, l, buf)
		}
	}
	partial := n < total
	if got.Truncated != (partial && !q.tcp) {
		return fmt.Errorf("TC=%t with %d of %d records", got.Truncated, n, total)
	}
	if !partial {
		return nil
	}
	// Partial: the room left must be less than one more record (and its
	// glue), plus what the estimate spends on names miekg/dns compresses: the
	// CNAMEs and the first owner name.
	unit := nameLen(q.name)
	for _, rr := range got.Answer[:cnames] {
		unit += dns.Len(rr)
	}
	one := 0
	a, aaaa, srv, extra := records(e)
	for _, rr := range append(a, aaaa...) {
		one = max(one, dns.Len(rr))
	}
	for i, rr := range srv {
		one = max(one, dns.Len(rr)+dns.Len(extra[i]))
	}
	unit += one
	if left := buf - c.Len(); left >= unit {
		return fmt.Errorf("%d of %d records and %d octets left: another would have fit (%d)", n, total, left, unit)
	}
	return nil
}

// SRV records rotate as addresses do, so that over as many queries as the set
// has records, each one comes first once, however few fit in one answer.
func TestAnswerRotation(t *testing.T) {
	p := bigPlugin()
	for _, q := range []ask{
		{"_postgresql._tcp.c200.pgcluster.lan.", dns.TypeSRV, 0, true},
		{"_postgresql._tcp.c200.pgcluster.lan.", dns.TypeSRV, 1232, false},
		{"c200.pgcluster.lan.", dns.TypeA, 0, false},
		{"c10000.pgcluster.lan.", dns.TypeA, 1232, false},
		{"big.pgcluster.lan.", dns.TypeAAAA, 0, true},
	} {
		_, _, total := lookup(p.snapshot(), q)
		first := map[string]bool{}
		for range total {
			_, got := serve(t, p, q, false)
			var rr dns.RR
			for _, rr = range got.Answer {
				if rr.Header().Rrtype == q.qtype {
					break
				}
			}
			first[rr.String()] = true
		}
		if len(first) != total {
			t.Errorf("%s: over %d queries, %d different records came first, want %d", q, total, len(first), total)
		}
	}
}

// lookup returns the entry q's answer comes from, after how many CNAMEs, and
// how many records of q's type it has.
func lookup(snap *snapshot, q ask) (e *entry, cnames, total int) {
	e = entryOf(snap, strings.ToLower(q.name))
	if e == nil {
		return nil, 0, 0
	}
	_, al, _ := snap.lookup(strings.ToLower(q.name), testZone)
	for ; al != nil && !e.ent; al = snap.parts[al.target].alias {
		cnames++
	}
	total = map[uint16]int{dns.TypeA: len(e.a), dns.TypeAAAA: len(e.aaaa), dns.TypeSRV: len(e.srv)}[q.qtype]
	return e, cnames, total
}

// An address answer holds the snapshot's own records only when every writer
// of the reply is one pgcluster knows to only read it (the server's
// ScrubWriter, the log and prometheus plugins' recorders over it); any other
// writer (cache's, rewrite's, one unknown) gets copies it may
// change.
func TestAnswerSharesRecordsOnlyWithReaders(t *testing.T) {
	p := bigPlugin()
	scrub := func(r *dns.Msg, client dns.ResponseWriter) dns.ResponseWriter {
		return request.NewScrubWriter(r, client)
	}
	for _, tc := range []struct {
		name   string
		chain  func(r *dns.Msg, client dns.ResponseWriter) dns.ResponseWriter
		shared bool
	}{
		{"the server's ScrubWriter", scrub, true},
		{"log", func(r *dns.Msg, c dns.ResponseWriter) dns.ResponseWriter { return dnstest.NewRecorder(scrub(r, c)) }, true},
		{"prometheus", func(r *dns.Msg, c dns.ResponseWriter) dns.ResponseWriter { return metrics.NewRecorder(scrub(r, c)) }, true},
		{"prometheus and log", func(r *dns.Msg, c dns.ResponseWriter) dns.ResponseWriter {
			return metrics.NewRecorder(dnstest.NewRecorder(scrub(r, c)))
		}, true},
		{"no ScrubWriter", func(r *dns.Msg, c dns.ResponseWriter) dns.ResponseWriter { return c }, false},
		{"log without a ScrubWriter", func(r *dns.Msg, c dns.ResponseWriter) dns.ResponseWriter { return dnstest.NewRecorder(c) }, false},
		{"a writer that rewrites", func(r *dns.Msg, c dns.ResponseWriter) dns.ResponseWriter { return hostileWriter{scrub(r, c)} }, false},
		{"log over a writer that rewrites", func(r *dns.Msg, c dns.ResponseWriter) dns.ResponseWriter {
			return dnstest.NewRecorder(hostileWriter{scrub(r, c)})
		}, false},
	} {
		for _, q := range []ask{
			{"c30.pgcluster.lan.", dns.TypeA, 0, false},
			{"c30.pgcluster.lan.", dns.TypeAAAA, 1232, true},
			{"big.pgcluster.lan.", dns.TypeAAAA, 0, false}, // a CNAME first
		} {
			r := q.msg()
			client := dnstest.NewRecorder(&test.ResponseWriter{TCP: q.tcp})
			if _, err := p.ServeDNS(context.Background(), tc.chain(r, client), r); err != nil {
				t.Fatalf("%s, %s: %v", tc.name, q, err)
			}
			e, _, _ := lookup(p.snapshot(), q)
			own := e.records(p.ttl)
			n := 0
			for _, rr := range client.Msg.Answer {
				if rr.Header().Rrtype != q.qtype {
					continue
				}
				n++
				if got := slices.Contains(own.a, rr) || slices.Contains(own.aaaa, rr); got != tc.shared {
					t.Errorf("%s, %s: %v is the snapshot's own record: %t, want %t", tc.name, q, rr, got, tc.shared)
				}
			}
			if n == 0 {
				t.Errorf("%s, %s: no address in the answer:\n%v", tc.name, q, client.Msg)
			}
		}
	}
}

// Two nodes of one cluster at one address (two ports, or one address
// written twice, once IPv4-mapped) are one address record in every set
// that holds both, each node keeping its SRV record; in a set of many
// nodes too.
func TestAnswerDuplicateAddresses(t *testing.T) {
	nodes := testNodes()
	second := node("local", "pg5", "192.0.2.2", "standby")
	second.Port = 5433
	mapped := node("local", "pg6", "::ffff:192.0.2.2", "standby")
	nodes = append(nodes, second, mapped)
	for i := range 40 {
		addr := "192.0.2.50"
		if i%2 == 1 {
			addr = "2001:db8::50"
		}
		nodes = append(nodes, node("many", fmt.Sprintf("n%d", i), addr, "standby"))
	}
	p := newTestPlugin(buildInput{nodes: nodes, aliases: testAliases})
	for _, tc := range []struct {
		name  string
		qtype uint16
		want  string
	}{
		{"local.", dns.TypeA, "192.0.2.1 192.0.2.2"},
		{"standby.local.", dns.TypeA, "192.0.2.2"},
		{"replica.local.", dns.TypeA, "192.0.2.2"},
		{"prefer-standby.local.", dns.TypeA, "192.0.2.2"},
		{"prod.", dns.TypeA, "192.0.2.1 192.0.2.2"},
		{"many.", dns.TypeA, "192.0.2.50"},
		{"many.", dns.TypeAAAA, "2001:db8::50"},
		{"standby.many.", dns.TypeAAAA, "2001:db8::50"},
	} {
		var got []string
		for _, rr := range query(t, p, tc.name+testZone, tc.qtype).Answer {
			switch rr := rr.(type) {
			case *dns.A:
				got = append(got, rr.A.String())
			case *dns.AAAA:
				got = append(got, rr.AAAA.String())
			}
		}
		sort.Strings(got)
		if strings.Join(got, " ") != tc.want {
			t.Errorf("%s %s: %v, want %s", tc.name, dns.TypeToString[tc.qtype], got, tc.want)
		}
	}
	var ports []string
	for _, rr := range query(t, p, "_postgresql._tcp.standby.local."+testZone, dns.TypeSRV).Answer {
		srv := rr.(*dns.SRV)
		ports = append(ports, fmt.Sprintf("%s:%d", strings.TrimSuffix(srv.Target, ".local."+testZone), srv.Port))
	}
	sort.Strings(ports)
	if got := strings.Join(ports, " "); got != "pg2:5432 pg3:5433 pg5:5433 pg6:5432" {
		t.Errorf("standby SRV: %s, want every node's", got)
	}
}
