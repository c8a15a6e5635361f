package pgcluster

import (
	"net"
	"slices"
	"strings"

	"github.com/coredns/coredns/plugin/metrics"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"
)

// Octets on the wire of the parts of a reply, as miekg/dns packs them.
const (
	headerLen   = 12 // the message header
	questionLen = 4  // type and class after the question's name
	rrFixedLen  = 10 // type, class, TTL and RDLENGTH of a record
	pointerLen  = 2  // a name compressed to a pointer
	srvFixedLen = 6  // priority, weight and port of an SRV record
	// maxPointer is how far back a compression pointer reaches: miekg/dns
	// only remembers names packed before this offset.
	maxPointer = 1 << 14
	// maxUDP caps a UDP reply whatever buffer the client offers, as DNS Flag
	// Day 2020 advises: larger datagrams risk IP fragmentation.
	maxUDP = 1232
)

// budget is what one reply may still take of the client's buffer. Every
// length it counts is an upper bound of what miekg/dns packs, so a reply
// kept within it is never cut by CoreDNS's Truncate.
type budget struct {
	used int // octets of the reply so far
	size int // octets the reply may take
	// partial is set when records were left out for lack of room.
	partial bool
	// failOpen is set when the answer names nodes failing their check
	// (all_down open).
	failOpen bool
	udp      bool
	zone     string
	// chained is set once a CNAME has put the owner of the records that
	// follow, its target, into the message: they point to it.
	chained bool
	// shared is set when every writer of the reply only reads it (see
	// readOnlyWriter): the answer may hold the snapshot's own records.
	shared bool
	// asker is where the client is, with topology on; nil with it off.
	asker *asker
}

// newBudget returns the budget of the reply to state's request: the client's
// buffer (over UDP its EDNS0 size, at least 512 and at most 1232; over TCP
// 65535), less the header, the question and the OPT record CoreDNS's writer
// will add.
func newBudget(state request.Request, zone string) budget {
	b := budget{size: state.Size(), used: headerLen, udp: state.Proto() == "udp", zone: zone, shared: readOnlyWriter(state.W)}
	if b.udp {
		b.size = min(b.size, maxUDP)
	}
	if len(state.Req.Question) > 0 {
		b.used += len(state.Req.Question[0].Name) + 1 + questionLen
	}
	if o := state.Req.IsEdns0(); o != nil {
		b.size -= dns.Len(o)
	}
	return b
}

// readOnlyWriter reports whether w and every writer under it only read the
// reply they write: CoreDNS's ScrubWriter, which the server puts first
// (its Truncate and Len read the records, it adds the OPT record to the
// additional section), and on the way the recorders of the log and
// prometheus plugins, which keep the reply to read after the answer. Other
// writers may change records in place (cache rewrites TTLs, rewrite
// names), so their replies get copies.
func readOnlyWriter(w dns.ResponseWriter) bool {
	for {
		switch x := w.(type) {
		case *request.ScrubWriter:
			return true
		case *dnstest.Recorder:
			w = x.ResponseWriter
		case *metrics.Recorder:
			w = x.Recorder.ResponseWriter
		default:
			return false
		}
	}
}

func (b *budget) left() int { return b.size - b.used }

// cname counts the CNAME record of hop hop of a chain. The first spells out
// its owner (the question's name, perhaps in another case) and its target;
// each later one points to the previous target for its owner, and to the
// zone's name, which the first target brought, for its target's end.
func (b *budget) cname(rr *dns.CNAME, hop int) {
	if hop == 0 {
		b.used += nameLen(rr.Hdr.Name) + rrFixedLen + nameLen(rr.Target)
	} else {
		b.used += pointerLen + rrFixedLen + b.targetLen(rr.Target)
	}
	b.chained = true
}

// targetLen is what a name in a record's data takes once the zone's name
// is in the message: a name inside the zone, its labels before the zone's
// and a pointer to it; any other name, spelled out.
func (b *budget) targetLen(name string) int {
	if strings.HasSuffix(name, "."+b.zone) {
		return len(name) - len(b.zone) + pointerLen
	}
	return nameLen(name)
}

// ownerLen is what the owner name of the first record of a set takes.
func (b *budget) ownerLen(owner string) int {
	if b.chained {
		return pointerLen
	}
	return nameLen(owner)
}

// nameLen is the uncompressed length of name on the wire: never less than
// what miekg/dns packs it in.
func nameLen(name string) int { return len(name) + 1 }

// rotation returns where the records of a set of n begin in this answer: one
// further along on each query, so that over n queries each one comes first once.
func (p *PgCluster) rotation(n int) int { return int(p.rotate.Add(1) % uint32(n)) }

// fit counts in b what k of n records of one RRset (A or AAAA records of
// owner, rdlen octets of data each) take, as many as fit, and returns k.
// The cost is that of the records returned, whatever the size of the set.
func fit(b *budget, owner string, n, rdlen int) int {
	// The first record spells its owner out, the others point to it.
	first := b.ownerLen(owner) + rrFixedLen + rdlen
	each := pointerLen + rrFixedLen + rdlen
	k := 0
	if left := b.left(); left >= first {
		k = min(n, 1+(left-first)/each)
		b.used += first + (k-1)*each
	}
	if k < n {
		b.partial = true
	}
	return k
}

// take counts in b as many of n records of one RRset as fit (see fit) and
// returns how many, and where in the set they start: one further along on
// each query that takes any.
func (p *PgCluster) take(b *budget, owner string, n, rdlen int) (k, start int) {
	if n == 0 {
		return 0, 0
	}
	if k = fit(b, owner, n, rdlen); k == 0 {
		return 0, 0
	}
	return k, p.rotation(n)
}

// appendWindow appends the k records of a set from start on to ans, from
// twice, the set twice over. Into an empty answer it puts the window itself,
// with no room to grow: an append to it makes a new array.
func appendWindow(ans, twice []dns.RR, start, k int) []dns.RR {
	w := twice[start : start+k : start+k]
	if len(ans) == 0 {
		return w
	}
	return append(ans, w...)
}

// addresses appends to m's answer as many of e's A or AAAA records (qtype)
// as fit b, taken in turn from a rotating start. When the writers only
// read the reply (b.shared), they are e's shared records; otherwise they
// are made into one new array, with their addresses, so that nothing a
// writer does to the reply reaches the snapshot.
func (p *PgCluster) addresses(m *dns.Msg, b *budget, e *entry, qtype uint16) {
	n, rdlen := len(e.a), net.IPv4len
	if qtype == dns.TypeAAAA {
		n, rdlen = len(e.aaaa), net.IPv6len
	}
	if b.asker != nil && e.topo != nil && n > 0 {
		// An answer that depends on the client's place; an unmapped
		// client's is every client's before topology.
		b.asker.dependent = true
		if b.asker.mapped {
			p.placedAddresses(m, b, e, qtype, n, rdlen)
			return
		}
		b.asker.answered(distOther)
	}
	k, start := p.take(b, e.owner, n, rdlen)
	if k == 0 {
		return
	}
	if b.shared {
		m.Answer = appendWindow(m.Answer, e.sharedAddresses(qtype, p.ttl), start, k)
		return
	}
	m.Answer = slices.Grow(m.Answer, k)
	if qtype == dns.TypeA {
		m.Answer = appendAddressCopies(m.Answer, e.a, start, k, func(ip *[net.IPv4len]byte) dns.A {
			return dns.A{Hdr: hdr(e.owner, dns.TypeA, p.ttl), A: ip[:]}
		})
		return
	}
	m.Answer = appendAddressCopies(m.Answer, e.aaaa, start, k, func(ip *[net.IPv6len]byte) dns.AAAA {
		return dns.AAAA{Hdr: hdr(e.owner, dns.TypeAAAA, p.ttl), AAAA: ip[:]}
	})
}

// placedAddresses appends to m's answer as many of e's A or AAAA records
// (qtype, n of them, rdlen octets each) as fit b, in the order the
// client's place gives them (see placedSequence). The records are e's
// shared ones, or copies as in addresses.
func (p *PgCluster) placedAddresses(m *dns.Msg, b *budget, e *entry, qtype uint16, n, rdlen int) {
	pl := &e.topo.a
	if qtype == dns.TypeAAAA {
		pl = &e.topo.aaaa
	}
	seq := placedSequence(pl, b.asker.place, p.topology == topologyLocal, p.minLocal, int(p.rotate.Add(1)%uint32(n)))
	k := fit(b, e.owner, seq.n, rdlen)
	if k == 0 {
		return
	}
	b.asker.answered(seq.groups[0].dist)
	m.Answer = slices.Grow(m.Answer, k)
	at := func(i int) int { idx, _ := seq.at(i); return idx }
	if b.shared {
		set := e.sharedAddresses(qtype, p.ttl)
		for i := range k {
			m.Answer = append(m.Answer, set[at(i)])
		}
		return
	}
	if qtype == dns.TypeA {
		m.Answer = appendAddressCopiesAt(m.Answer, e.a, k, at, func(ip *[net.IPv4len]byte) dns.A {
			return dns.A{Hdr: hdr(e.owner, dns.TypeA, p.ttl), A: ip[:]}
		})
		return
	}
	m.Answer = appendAddressCopiesAt(m.Answer, e.aaaa, k, at, func(ip *[net.IPv6len]byte) dns.AAAA {
		return dns.AAAA{Hdr: hdr(e.owner, dns.TypeAAAA, p.ttl), AAAA: ip[:]}
	})
}

// appendAddressCopiesAt appends to ans k records of the addresses ips, the
// i-th of ips[at(i)], each made by rec from its own copy of the address,
// all in one new array (see appendAddressCopies).
func appendAddressCopiesAt[IP, T any, PT interface {
	*T
	dns.RR
}](ans []dns.RR, ips []IP, k int, at func(i int) int, rec func(ip *IP) T) []dns.RR {
	recs := make([]struct {
		rr T
		ip IP
	}, k)
	for i := range recs {
		r := &recs[i]
		r.ip = ips[at(i)]
		r.rr = rec(&r.ip)
		ans = append(ans, PT(&r.rr))
	}
	return ans
}

// appendAddressCopies appends to ans k records of the addresses ips, from
// start on and around, made by rec from their own copy of the address: the
// records and addresses are one new array, so nothing a writer does to the
// reply reaches the snapshot.
func appendAddressCopies[IP, T any, PT interface {
	*T
	dns.RR
}](ans []dns.RR, ips []IP, start, k int, rec func(ip *IP) T) []dns.RR {
	recs := make([]struct {
		rr T
		ip IP
	}, k)
	for i := range recs {
		r := &recs[i]
		r.ip = ips[(start+i)%len(ips)]
		r.rr = rec(&r.ip)
		ans = append(ans, PT(&r.rr))
	}
	return ans
}

// appendCopies appends copies of k records of rrs, from start on and around,
// to ans. The records are copied into one new array, so nothing a writer does
// to the reply (CoreDNS's cache rewrites TTLs in place) reaches the snapshot.
func appendCopies[T any, PT interface {
	*T
	dns.RR
}](ans, rrs []dns.RR, start, k int) []dns.RR {
	recs := make([]T, k)
	j := start
	for i := range recs {
		recs[i] = *rrs[j].(PT)
		ans = append(ans, PT(&recs[i]))
		if j++; j == len(rrs) {
			j = 0
		}
	}
	return ans
}

// services appends to m as many SRV records of e as fit b, each with the
// address of its target in the additional section, taken in turn from a
// rotating start.
func (p *PgCluster) services(m *dns.Msg, b *budget, e *entry) {
	n := len(e.srv)
	if n == 0 {
		return
	}
	seq := p.serviceSequence(b, e, n)
	n = seq.n
	// First count what fits: SRV records go in the answer, their glue after
	// all of them in the additional section.
	owner := b.ownerLen(e.owner)
	answer, extra := b.used, 0
	k, k4 := 0, 0
	// parent is the domain every target of the set is in (its cluster's
	// name), once packed within reach of a pointer.
	parent := ""
	for ; k < n; k++ {
		j, _ := seq.at(k)
		srv := e.srv[j]
		target := nameLen(srv.target)
		srvLen := owner + rrFixedLen + srvFixedLen + target
		// miekg/dns does not compress an SRV target, but remembers it and its
		// parents when it starts within reach of a pointer: the glue's owner
		// then points to it, or else to the parent.
		label := strings.IndexByte(srv.target, '.') + 1
		glueOwner := target
		switch {
		case answer+srvLen-target < maxPointer:
			glueOwner = pointerLen
			if parent == "" {
				parent = srv.target[label:]
			}
		case parent != "" && srv.target[label:] == parent:
			glueOwner = label + pointerLen
		}
		v4 := srv.addr.Is4()
		glueLen := glueOwner + rrFixedLen + net.IPv6len
		if v4 {
			glueLen = glueOwner + rrFixedLen + net.IPv4len
		}
		if answer+srvLen+extra+glueLen > b.size {
			break
		}
		answer += srvLen
		extra += glueLen
		if v4 {
			k4++
		}
		owner = pointerLen
	}
	b.used = answer + extra
	if k < n {
		b.partial = true
	}
	if k == 0 {
		return
	}
	// Then make the records: SRV in the answer, the glue in the same order,
	// each kind into one array.
	recs := make([]dns.SRV, k)
	a, aaaa := make([]dns.A, 0, k4), make([]dns.AAAA, 0, k-k4)
	ips := make([]byte, 0, k4*net.IPv4len+(k-k4)*net.IPv6len)
	m.Answer = slices.Grow(m.Answer, k)
	m.Extra = make([]dns.RR, 0, k)
	if b.asker != nil {
		_, d := seq.at(0)
		b.asker.answered(d)
	}
	for i := 0; i < k; i++ {
		j, d := seq.at(i)
		srv := e.srv[j]
		priority := uint16(0)
		if b.asker != nil {
			priority = srvPriority[d]
		}
		recs[i] = dns.SRV{Hdr: hdr(e.owner, dns.TypeSRV, p.ttl), Priority: priority, Weight: 10, Port: srv.port, Target: srv.target}
		m.Answer = append(m.Answer, &recs[i])
		if srv.addr.Is4() {
			ip4 := srv.addr.As4()
			ips = append(ips, ip4[:]...)
			a = append(a, dns.A{Hdr: hdr(srv.target, dns.TypeA, p.ttl), A: ips[len(ips)-net.IPv4len : len(ips) : len(ips)]})
			m.Extra = append(m.Extra, &a[len(a)-1])
		} else {
			ip6 := srv.addr.As16()
			ips = append(ips, ip6[:]...)
			aaaa = append(aaaa, dns.AAAA{Hdr: hdr(srv.target, dns.TypeAAAA, p.ttl), AAAA: ips[len(ips)-net.IPv6len : len(ips) : len(ips)]})
			m.Extra = append(m.Extra, &aaaa[len(aaaa)-1])
		}
	}
}

// serviceSequence is the order of e's n SRV records for this answer: the
// client's place's (see placedSequence), or the set's own from a rotating
// start, as before topology, for an unmapped client, a set whose nodes have
// no place, or topology off.
func (p *PgCluster) serviceSequence(b *budget, e *entry, n int) sequence {
	if b.asker == nil {
		return plainSequence(n, p.rotation(n), distZone)
	}
	if e.topo == nil {
		return plainSequence(n, p.rotation(n), distOther)
	}
	b.asker.dependent = true
	if !b.asker.mapped {
		return plainSequence(n, p.rotation(n), distOther)
	}
	return placedSequence(&e.topo.srv, b.asker.place, p.topology == topologyLocal, p.minLocal, p.rotation(n))
}

// appendGlue appends to extra copies of as many of glue, the addresses of
// the zone's name servers (A records first), as fit b after ns, the NS
// set of zone. Glue is optional in an answer (RFC 9471 requires it only of
// a referral), so what does not fit is left out, where CoreDNS's writer
// (request.Scrub) would drop it and set TC.
func appendGlue(extra []dns.RR, b *budget, zone string, ns, glue []dns.RR) []dns.RR {
	for i, rr := range ns {
		owner := pointerLen
		if i == 0 {
			owner = b.ownerLen(zone)
		}
		b.used += owner + rrFixedLen + b.targetLen(rr.(*dns.NS).Ns)
	}
	for _, rr := range glue {
		// A copy that holds its own address, so that nothing a writer does
		// to the reply reaches the snapshot.
		var c dns.RR
		var rdlen int
		switch rr := rr.(type) {
		case *dns.A:
			a := *rr
			a.A = slices.Clone(rr.A)
			c, rdlen = &a, net.IPv4len
		case *dns.AAAA:
			a := *rr
			a.AAAA = slices.Clone(rr.AAAA)
			c, rdlen = &a, net.IPv6len
		default:
			continue
		}
		// Its owner is an NS record's target: a pointer.
		size := pointerLen + rrFixedLen + rdlen
		if b.left() < size {
			break
		}
		b.used += size
		extra = append(extra, c)
	}
	return extra
}

// copyRR returns a copy of rr that a writer may change.
func copyRR[T any, PT interface {
	*T
	dns.RR
}](rr PT) dns.RR {
	c := *rr
	return PT(&c)
}

// sharedAddresses is e's shared A records, or AAAA records for qtype AAAA,
// with ttl (see entry.records).
func (e *entry) sharedAddresses(qtype uint16, ttl uint32) []dns.RR {
	r := e.records(ttl)
	if qtype == dns.TypeAAAA {
		return r.aaaa
	}
	return r.a
}
