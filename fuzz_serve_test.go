package pgcluster

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/pkg/edns"
	"github.com/coredns/coredns/plugin/test"
	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/health"
)

// FuzzServeDNS sends arbitrary packets to the handler as a CoreDNS server
// does (dnsserver.Server.ServeDNS: no question or another class refused
// first, a bad EDNS version answered at once, then the reply written through
// request.ScrubWriter), over UDP or TCP, to a snapshot chosen by shape among
// varied ones (large clusters, IPv6, checks with all_down open or closed,
// two zones, fallthrough with topology prefer or local, alias chains, names
// near 255 octets). pick, when not 0, puts one of the snapshot's names in
// the question, in the packet's case, so that most packets ask something the
// zone holds. Nothing may
// panic, and every reply must:
//   - be the only one written, with the request's ID and question, and pack;
//   - fit the client's buffer, and over UDP 1232 octets compressed when it
//     is the plugin's own (README, Large clusters; but see below);
//   - never be cut by the ScrubWriter's Truncate: the handler's budget
//     leaves nothing for it to cut (but a long CNAME chain, whose names
//     the budget counts without bounding, which it may cut, with TC);
//   - hold records that belong: each owned by the question's name or a
//     CNAME target before it, in a zone of the snapshot, with its TTL;
//   - be the same, from the same rotation, through writers the handler
//     knows to only read the reply (it then shares the snapshot's address
//     records) as through others (which get copies);
//   - leave the snapshot as it was, whatever a writer after the handler does
//     to the reply (here: TTLs, owner names, addresses and SOA fields
//     rewritten in place, as the cache and rewrite plugins do): the same
//     query asked again gets the same reply.
func FuzzServeDNS(f *testing.F) {
	for _, s := range serveSeeds() {
		f.Add(s.shape, s.tcp, s.pick, s.packet)
	}
	f.Fuzz(func(t *testing.T, shape uint8, tcp bool, pick uint16, packet []byte) {
		r := new(dns.Msg)
		if err := r.Unpack(packet); err != nil || dns.DefaultMsgAcceptFunc(header(packet)) != dns.MsgAccept || len(r.Question) == 0 {
			return // miekg/dns's server, or CoreDNS's, answers it or drops it itself
		}
		fz := fuzzPlugin(shape)
		if pick != 0 {
			name := fz.names[int(pick-1)%len(fz.names)]
			r.Question[0].Name = withCase(name, r.Question[0].Name)
		}
		if r.Question[0].Qclass != dns.ClassINET {
			return // REFUSED by the server, before any plugin
		}
		if _, err := edns.Version(r); err != nil {
			return // BADVERS by the server, before any plugin
		}
		// The request as the handler sees it, a fresh copy each time:
		// SizeAndDo reuses and rewrites its OPT record. A deep copy, not
		// packed and unpacked again: miekg/dns reads some records it cannot
		// read again once packed (an SOA cut short, seed 36bcfcbabd111ce4),
		// and the server never packs a request.
		fresh := func() *dns.Msg { return r.Copy() }

		start := fz.p.rotate.Load()
		out := &wireWriter{ResponseWriter: test.ResponseWriter{TCP: tcp}}
		req := fresh()
		seen := &seenWriter{ResponseWriter: request.NewScrubWriter(req, out)}
		rcode, _ := fz.p.ServeDNS(context.Background(), seen, req)
		if !plugin.ClientWrite(rcode) {
			// dnsserver's errorFunc
			m := new(dns.Msg)
			m.SetRcode(req, rcode)
			state := request.Request{W: seen.ResponseWriter, Req: req}
			state.SizeAndDo(m)
			seen.ResponseWriter.WriteMsg(m)
		}
		if out.n != 1 {
			t.Fatalf("%d replies written, want 1 (rcode %d)", out.n, rcode)
		}
		reply, wireLen := out.msg, out.wireLen
		if out.packErr != nil {
			t.Fatalf("the reply does not pack: %v\n%v", out.packErr, reply)
		}
		state := request.Request{W: &test.ResponseWriter{TCP: tcp}, Req: fresh()}
		if reply.Id != r.Id || !reply.Response || len(reply.Question) != 1 || reply.Question[0] != r.Question[0] {
			t.Fatalf("the reply does not answer the request: %v", reply.MsgHdr)
		}
		if wireLen > state.Size() {
			t.Fatalf("a reply of %d octets for a client buffer of %d", wireLen, state.Size())
		}
		if !seen.own {
			return // the next plugin's, or the server's error
		}
		// The budget counts names compressed. The ScrubWriter's Truncate
		// sends a reply that fits the client's buffer uncompressed as it
		// is, and compresses over UDP only above 1480 octets (IPv4), so an
		// IPv4 client offering more than 1232 may get up to 1480: the
		// bound checked is the budget's.
		if !tcp && compressedLen(out.msg) > maxUDP {
			t.Fatalf("a UDP reply of %d octets compressed (%d on the wire), over %d", compressedLen(out.msg), wireLen, maxUDP)
		}
		if got, want := counts(reply), seen.counts; got != want || reply.Truncated != seen.tc {
			// The budget bounds addresses and SRV records; a CNAME chain
			// (up to 8 names of up to 255 octets) and the SOA of a
			// negative answer after it are counted but not bounded, so a
			// long chain may be cut here instead: then with TC.
			if !hasCNAME(seen.before) || !reply.Truncated {
				t.Fatalf("the ScrubWriter cut the reply: answer, authority, additional %v before it, %v after (TC %t, was %t)", want, got, reply.Truncated, seen.tc)
			}
		}
		checkOwners(t, fz, seen.before)

		// The same query from the same rotation through writers that only
		// read the reply (the log plugin's recorder over the ScrubWriter),
		// which get the snapshot's own address records: the same reply on
		// the wire as the copies gave.
		fz.p.rotate.Store(start)
		shared := fresh()
		client := dnstest.NewRecorder(&test.ResponseWriter{TCP: tcp})
		fz.p.ServeDNS(context.Background(), dnstest.NewRecorder(request.NewScrubWriter(shared, client)), shared)
		if client.Msg == nil || !samePacked(client.Msg, out.msg) {
			t.Fatalf("the reply with the snapshot's own records differs; with copies:\n%s\nwith the snapshot's own:\n%v", out.msg, client.Msg)
		}

		// Ask again from the same rotation: the same reply, whatever the
		// writers did to the first.
		fz.p.rotate.Store(start)
		again := fresh()
		rec := dnstest.NewRecorder(&test.ResponseWriter{TCP: tcp})
		fz.p.ServeDNS(context.Background(), rec, again)
		if rec.Msg == nil {
			t.Fatalf("no reply the second time")
		}
		if got, want := rec.Msg.String(), seen.before.String(); got != want {
			t.Fatalf("a writer's changes to a reply reached the snapshot; first reply:\n%s\nthe same query again:\n%s", want, got)
		}
	})
}

// compressedLen is m's length packed with name compression.
func compressedLen(m *dns.Msg) int {
	c := m.Copy()
	c.Compress = true
	return c.Len()
}

// hasCNAME reports whether m's answer holds a CNAME record.
func hasCNAME(m *dns.Msg) bool {
	return slices.ContainsFunc(m.Answer, func(rr dns.RR) bool { return rr.Header().Rrtype == dns.TypeCNAME })
}

// header is the header of a packet, as a MsgAcceptFunc reads it.
func header(b []byte) dns.Header {
	u := func(i int) uint16 { return uint16(b[i])<<8 | uint16(b[i+1]) }
	return dns.Header{Id: u(0), Bits: u(2), Qdcount: u(4), Ancount: u(6), Nscount: u(8), Arcount: u(10)}
}

// checkOwners fails t unless every record of m, an answer of the handler,
// belongs: an answer record is owned by the question's name or by a CNAME
// target before it, every record is in a zone of the snapshot, with the
// zone's TTL.
func checkOwners(t *testing.T, fz *fuzzed, m *dns.Msg) {
	t.Helper()
	owners := map[string]bool{strings.ToLower(m.Question[0].Name): true}
	for _, rr := range m.Answer {
		h := rr.Header()
		if !owners[strings.ToLower(h.Name)] {
			t.Fatalf("answer record %v is not owned by the question's name or a CNAME target before it", rr)
		}
		if c, ok := rr.(*dns.CNAME); ok {
			owners[strings.ToLower(c.Target)] = true
		}
	}
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			h := rr.Header()
			if h.Rrtype == dns.TypeOPT {
				continue
			}
			if plugin.Zones(fz.p.Zones).Matches(strings.ToLower(h.Name)) == "" {
				t.Fatalf("record %v outside the zones %v", rr, fz.p.Zones)
			}
			if h.Ttl != fz.p.ttl {
				t.Fatalf("record %v has TTL %d, want %d", rr, h.Ttl, fz.p.ttl)
			}
		}
	}
}

// seenWriter is what the handler writes to: it keeps a copy of the reply as
// the handler made it, before the ScrubWriter under it sizes it.
type seenWriter struct {
	dns.ResponseWriter
	own    bool // written by the handler (not the next plugin)
	before *dns.Msg
	counts [3]int
	tc     bool
}

func (w *seenWriter) WriteMsg(m *dns.Msg) error {
	w.before = m.Copy()
	w.counts, w.tc = counts(m), m.Truncated
	w.own = true
	return w.ResponseWriter.WriteMsg(m)
}

// counts are the records of m's answer, authority and additional sections,
// OPT aside.
func counts(m *dns.Msg) [3]int {
	extra := 0
	for _, rr := range m.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			extra++
		}
	}
	return [3]int{len(m.Answer), len(m.Ns), extra}
}

// wireWriter is the connection under CoreDNS's writers: it packs the reply
// as miekg/dns's server does, then rewrites the reply's records in place as
// a writer above it could (the cache plugin its TTLs, rewrite its names).
type wireWriter struct {
	test.ResponseWriter
	n       int
	msg     *dns.Msg
	wireLen int
	packErr error
}

func (w *wireWriter) WriteMsg(m *dns.Msg) error {
	w.n++
	w.msg = m.Copy()
	b, err := m.Pack()
	w.wireLen, w.packErr = len(b), err
	for _, sec := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range sec {
			h := rr.Header()
			if h.Rrtype == dns.TypeOPT {
				continue
			}
			h.Ttl, h.Name = 0, "rewritten."+h.Name
			switch rr := rr.(type) {
			case *dns.A:
				clear(rr.A)
			case *dns.AAAA:
				clear(rr.AAAA)
			case *dns.SOA:
				rr.Serial, rr.Minttl, rr.Ns = 0, 0, "rewritten."
			case *dns.SRV:
				rr.Port, rr.Target = 0, "rewritten."
			case *dns.CNAME:
				rr.Target = "rewritten."
			case *dns.NS:
				rr.Ns = "rewritten."
			}
		}
	}
	return err
}

// withCase is name spelled in the case of like's letters, in turn.
func withCase(name, like string) string {
	if like == "" {
		return name
	}
	b := []byte(name)
	for i := range b {
		c := like[i%len(like)]
		switch {
		case c >= 'A' && c <= 'Z':
			b[i] = byte(strings.ToUpper(string(b[i]))[0])
		case c >= 'a' && c <= 'z':
			b[i] = byte(strings.ToLower(string(b[i]))[0])
		}
	}
	return string(b)
}

// fuzzed is a handler serving one snapshot shape, and the names to ask it.
type fuzzed struct {
	p     *PgCluster
	names []string
}

var (
	fuzzMu      sync.Mutex
	fuzzPlugins = map[uint8]*fuzzed{}
)

// fuzzPlugin returns the handler of a snapshot shape, built once per
// process: bits 0-1 the size of the large cluster (3, 40, 400 or 5,000
// nodes), bit 2 IPv6 addresses among them, bit 3 checks (bit 4: all_down
// closed), bit 5 a second zone, bit 6 fallthrough, bit 7 names near 255
// octets (63-octet labels) and an alias chain 8 deep. The large sizes take
// fewer of the other bits (see fuzzShape).
func fuzzPlugin(shape uint8) *fuzzed {
	shape = fuzzShape(shape)
	fuzzMu.Lock()
	defer fuzzMu.Unlock()
	if fz := fuzzPlugins[shape]; fz != nil {
		return fz
	}
	set := &settings{zones: []string{testZone}, ttl: 7, allDown: allDownOpen, staleAfter: 10 * time.Second,
		nsAddrs: []netip.Addr{netip.MustParseAddr("192.0.2.53"), netip.MustParseAddr("2001:db8::53")}}
	if shape&0x20 != 0 {
		set.zones = []string{testZone, "b.lan."}
	}
	big := [4]int{3, 40, 400, 5000}[shape&3]
	long := shape&0x80 != 0
	label := func(s string) string {
		if long {
			return s + strings.Repeat("x", 63-len(s))
		}
		return s
	}
	if long {
		// Five name servers with long names, in the zone: their NS set
		// fits 512 octets, their glue only in part.
		for i := range 5 {
			set.ns = append(set.ns, nameServer{name: label(fmt.Sprintf("ns%d", i)) + "." + testZone,
				addrs: []netip.Addr{netip.AddrFrom4([4]byte{192, 0, 2, byte(60 + i)}), netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(60 + i)})}})
		}
	}
	nodes := testNodes()
	bigName := label("big")
	for i := range big {
		n := Node{Cluster: bigName, Name: label(fmt.Sprintf("n%d", i)), Port: 5432 + i%3, Role: "standby", Healthy: i%17 != 16,
			Address: netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})}
		if shape&4 != 0 && i%2 == 1 {
			n.Address = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)})
		}
		if i == 0 {
			n.Role = "primary"
		}
		if i == 5 {
			n.HeartbeatAge = time.Minute // stale
		}
		nodes = append(nodes, n)
	}
	// Split brain, and a cluster whose every node fails its check.
	nodes = append(nodes, node("split", "s1", "192.0.2.31", "primary"), node("split", "s2", "192.0.2.32", "primary"),
		node("dark", "d1", "192.0.2.41", "primary"), node("dark", "d2", "2001:db8::42", "standby"))
	aliases := slices.Clone(testAliases)
	aliases = append(aliases, Alias{Alias: "bigalias", Target: bigName}, Alias{Alias: "loop1", Target: "loop2"}, Alias{Alias: "loop2", Target: "loop1"}, Alias{Alias: "dangling", Target: "nowhere"})
	if long {
		prev := bigName
		for i := range 8 {
			a := label(fmt.Sprintf("chain%d", i))
			aliases = append(aliases, Alias{Alias: a, Target: prev})
			prev = a
		}
	}
	var view health.View
	if shape&8 != 0 {
		set.check = checkPostgres
		set.maxLag = 1024
		if shape&0x10 != 0 {
			set.allDown = allDownClosed
		}
		verdicts := map[string]health.Verdict{}
		for i, n := range nodes {
			key := strings.ToLower(n.Cluster) + "/" + strings.ToLower(n.Name)
			v := health.Verdict{State: health.Up, Role: n.Role, WAL: uint64(i) * 700, Last: time.Unix(1e9, 0)}
			if i%4 == 3 || n.Cluster == "dark" {
				v = health.Verdict{State: health.Down, Cause: "refused", Detail: "connection refused", Last: time.Unix(1e9, 0)}
			}
			verdicts[key] = v
		}
		view = health.ViewOf(verdicts)
	}
	// The shapes with fallthrough answer by topology too (local with bit
	// 0x10, else prefer): nodes in zones a, b or none, the test writer's
	// source address (10.240.0.1) in a, and a packet's ECS option placed
	// where it points.
	var networks []Network
	if shape&0x40 != 0 {
		set.topology, set.minLocal = topologyPrefer, 2
		if shape&0x10 != 0 {
			set.topology = topologyLocal
		}
		for i := range nodes {
			nodes[i].Region, nodes[i].Zone = "r", [3]string{"a", "b", ""}[i%3]
		}
		networks = []Network{{Network: netip.MustParsePrefix("10.240.0.0/16"), Region: "r", Zone: "a"},
			{Network: netip.MustParsePrefix("10.0.0.0/8"), Region: "r", Zone: "b"},
			{Network: netip.MustParsePrefix("2001:db8::/32"), Region: "r", Zone: "a"}}
	}
	s := build(buildInput{settings: set, nodes: nodes, aliases: aliases, networks: networks, view: view})
	s.setSerial(1234, set.ttl)
	// No next plugin: what falls through is answered by the server.
	p := &PgCluster{Zones: set.zones, ttl: set.ttl, topology: set.topology, minLocal: set.minLocal, topo: newTopologyCounters(set)}
	if shape&0x40 != 0 {
		p.Fall.SetZonesFromArgs(nil)
	}
	p.pb = publisherOf(s)
	fz := &fuzzed{p: p, names: slices.Sorted(maps.Keys(owners(s)))}
	// Names the zone does not hold, under and beside the ones it does, and
	// names under an alias.
	for _, z := range set.zones {
		fz.names = append(fz.names, "nothere."+z, "x.pg1.local."+z, "primary.prod."+z, "_postgresql._tcp.standby.myapp-db."+z,
			"pg1.prod."+z, "primary.loop1."+z, "a.b.c.d."+z)
	}
	fz.names = append(fz.names, "example.org.", ".", "lan.")
	fuzzPlugins[shape] = fz
	return fz
}

// fuzzShape is shape with the bits its large cluster's size does not vary
// cleared: 400 nodes without fallthrough (32 shapes), 5,000 nodes with only
// IPv6, checks and long names (8 shapes). A shape is built inside the fuzz
// function the first time it is asked, and Go's fuzzing counts a call of
// more than 10 s as a crash ("deadlocked!", reported as "fuzzing process
// hung"): all 256 shapes, 64 of them with 5,000 nodes, took 39 s and 1 GB
// per worker on a loaded machine, and a 5,000-node one built there
// took a call past 10 s (seed 8e04784b037027e3).
func fuzzShape(shape uint8) uint8 {
	switch shape & 3 {
	case 2:
		return shape &^ 0x40
	case 3:
		return shape & 0x8f
	}
	return shape
}

// serveSeed is one seed of FuzzServeDNS.
type serveSeed struct {
	shape  uint8
	tcp    bool
	pick   uint16
	packet []byte
}

// serveSeeds are queries for names the zone holds and does not, of several
// types, with and without EDNS0 (small and large buffers), over UDP and
// TCP, for several shapes; and a few requests the server handles itself.
func serveSeeds() []serveSeed {
	q := func(name string, qt uint16, size uint16, opcode int) []byte {
		m := new(dns.Msg)
		m.SetQuestion(name, qt)
		m.Id = 0x4242
		m.Opcode = opcode
		if size > 0 {
			m.SetEdns0(size, true)
		}
		b, err := m.Pack()
		if err != nil {
			panic(err)
		}
		return b
	}
	var out []serveSeed
	for i, c := range []struct {
		name string
		qt   uint16
	}{
		{"local.pgcluster.lan.", dns.TypeA}, {"PRIMARY.Local.pgcluster.lan.", dns.TypeAAAA},
		{"_postgresql._tcp.local.pgcluster.lan.", dns.TypeSRV}, {"pg4.local.pgcluster.lan.", dns.TypeTXT},
		{"myapp-db.pgcluster.lan.", dns.TypeA}, {"primary.myapp-db.pgcluster.lan.", dns.TypeCNAME},
		{"pgcluster.lan.", dns.TypeSOA}, {"pgcluster.lan.", dns.TypeNS}, {"ns.pgcluster.lan.", dns.TypeAAAA},
		{"big.pgcluster.lan.", dns.TypeA}, {"_postgresql._tcp.big.pgcluster.lan.", dns.TypeSRV},
		{"bigalias.pgcluster.lan.", dns.TypeAAAA}, {"split.pgcluster.lan.", dns.TypeTXT},
		{"nothere.pgcluster.lan.", dns.TypeA}, {"pgcluster.lan.", dns.TypeAXFR}, {"example.org.", dns.TypeA},
		{"loop1.pgcluster.lan.", dns.TypeA}, {"dark.pgcluster.lan.", dns.TypeANY},
	} {
		for j, shape := range []uint8{0, 0x01, 0x0b, 0x36, 0xff} {
			size := [4]uint16{0, 512, 1232, 4096}[(i+j)%4]
			out = append(out, serveSeed{shape: shape, tcp: (i+j)%3 == 0, packet: q(c.name, c.qt, size, dns.OpcodeQuery)})
		}
	}
	// The large sets over UDP, in every buffer size.
	for _, size := range []uint16{0, 512, 1232, 4096} {
		for _, shape := range []uint8{0x01, 0x06, 0x1a} {
			for _, c := range []string{"big.pgcluster.lan.", "standby.bigalias.pgcluster.lan.", "_postgresql._tcp.big.pgcluster.lan."} {
				for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV} {
					out = append(out, serveSeed{shape: shape, packet: q(c, qt, size, dns.OpcodeQuery)})
				}
			}
		}
	}
	// The NS set of five long names over UDP: their glue fits in part.
	for _, size := range []uint16{0, 512, 1232} {
		for _, shape := range []uint8{0x80, 0xa0} {
			out = append(out, serveSeed{shape: shape, packet: q("pgcluster.lan.", dns.TypeNS, size, dns.OpcodeQuery)})
		}
	}
	out = append(out,
		serveSeed{shape: 0x03, pick: 7, packet: q("a.", dns.TypeSRV, 65535, dns.OpcodeQuery)},
		serveSeed{shape: 0x86, tcp: true, pick: 300, packet: q("A.b.", dns.TypeA, 0, dns.OpcodeQuery)},
		serveSeed{packet: q("local.pgcluster.lan.", dns.TypeSOA, 0, dns.OpcodeNotify)},
		serveSeed{packet: []byte{0x42, 0x42, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 3}}, // root, class CHAOS
	)
	return out
}
