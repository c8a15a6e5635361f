// Package pgcluster is a CoreDNS plugin that serves an authoritative zone for
// PostgreSQL clusters from a peer-registry table kept in PostgreSQL.
package pgcluster

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/pkg/fall"
	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// maxChain bounds the CNAME hops followed inside one answer.
const maxChain = 8

// PgCluster is the plugin handler.
type PgCluster struct {
	Next  plugin.Handler
	Zones []string
	Fall  fall.F

	ttl uint32
	// pb makes and holds the snapshot answered from; nil until start.
	pb *publisher
	// rotate turns the order of A, AAAA and SRV records, one step per query.
	rotate atomic.Uint32

	reg        *registry
	relay      *relay          // instead of reg, with redis and the relay on
	checksDone <-chan struct{} // closed when the health checks have stopped; nil without checks
	// failOpen counts the answers of all_down open, for the zone.
	failOpen prometheus.Counter
	// topology and minLocal: see settings; topo counts what they do.
	topology string
	minLocal int
	topo     *topologyCounters
	// segs, with check_scope zone or region, holds each segment's
	// snapshot: a client is answered from its segment's (nil otherwise).
	segs *segmentation
	// passive, for a passive instance (check passive) of check_scope
	// fleet, says whose verdicts it answers with, for _client's TXT.
	passive func() string
}

var _ plugin.Handler = (*PgCluster)(nil)

var errNotLoaded = errors.New("registry not loaded yet")

// snapshot is the snapshot answered from: nil before the first.
func (p *PgCluster) snapshot() *snapshot {
	if p.pb == nil {
		return nil
	}
	return p.pb.snap.Load()
}

// Name implements plugin.Handler.
func (p *PgCluster) Name() string { return "pgcluster" }

// ServeDNS implements plugin.Handler. It reads the current snapshot and
// answers from it: no lock, no I/O. Nothing of the snapshot goes into the
// reply uncopied, since the writers after it append to, truncate and rewrite
// the reply.
func (p *PgCluster) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	state := request.Request{W: w, Req: r}
	qname := state.Name()
	zone := p.zoneOf(qname)
	if zone == "" {
		return plugin.NextOrFailure(p.Name(), p.Next, ctx, w, r)
	}
	// NOTIFY is the only other opcode miekg/dns lets through; this zone is
	// no secondary of anything. Without the transfer plugin, CoreDNS's file
	// plugin refuses zone transfers; so does this one.
	if r.Opcode != dns.OpcodeQuery {
		return dns.RcodeNotImplemented, nil
	}
	if qt := state.QType(); qt == dns.TypeAXFR || qt == dns.TypeIXFR {
		return dns.RcodeRefused, nil
	}
	snap := p.snapshot()
	if snap == nil {
		return dns.RcodeServerFailure, errNotLoaded
	}
	var ask, placed *asker
	var seg *segment
	if p.topologyOn() || p.segs != nil || p.passive != nil && qname == under(labelClient, zone) {
		ecs, err := queryECS(r)
		if err != nil {
			p.topo.ecsError.Inc()
			return dns.RcodeFormatError, nil
		}
		if ecs != nil {
			p.topo.ecsAnswered.Inc()
		}
		placed = newAsker(state, ecs, snap.places)
		if p.segs != nil {
			// The client's segment's verdicts: its answer depends on
			// where it is, whatever topology does with it.
			var s *snapshot
			if s, seg = p.segs.forPlace(placed.place); s != nil {
				snap = s
			}
			placed.segmented = true
		}
		if qname == under(labelClient, zone) {
			return p.serveClient(w, r, state, placed, seg, snap), nil
		}
		if p.topologyOn() {
			ask = placed
		}
	}
	e, al, prefix := snap.lookup(qname, zone)
	if e == nil && p.Fall.Through(qname) {
		return plugin.NextOrFailure(p.Name(), p.Next, ctx, w, r)
	}

	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	b := newBudget(state, zone)
	b.asker = ask
	m.Rcode = p.answer(m, &b, snap, qname, e, al, prefix, state.QType())
	if ask != nil {
		p.countPlaced(ask)
	}
	if placed != nil && placed.ecs != nil {
		replyECS(m, placed, false)
	}
	// A UDP client that got part of the records may ask again over TCP.
	m.Truncated = b.partial && b.udp
	if negative(m, state.QType()) {
		m.Ns = []dns.RR{copyRR(snap.parts[zone].self.apex.soa)}
	} else if b.failOpen && p.failOpen != nil {
		p.failOpen.Inc()
	}
	w.WriteMsg(m)
	return dns.RcodeSuccess, nil
}

// topologyOn reports whether answers depend on the client's place.
func (p *PgCluster) topologyOn() bool { return p.topology != "" && p.topology != topologyOff }

// serveClient answers _client.<zone>: its TXT record says where this
// instance places the asker; any other type, NODATA.
func (p *PgCluster) serveClient(w dns.ResponseWriter, r *dns.Msg, state request.Request, ask *asker, seg *segment, snap *snapshot) int {
	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	if state.QType() == dns.TypeTXT {
		t := clientTXT(m.Question[0].Name, 0, ask, snap.places)
		switch {
		case p.segs != nil:
			t.Txt = append(t.Txt, p.segs.clientChecks(seg)...)
		case p.passive != nil:
			t.Txt = append(t.Txt, "checks=fleet", "verdicts="+p.passive())
		}
		m.Answer = []dns.RR{t}
	} else {
		m.Ns = []dns.RR{copyRR(snap.parts[p.zoneOf(state.Name())].self.apex.soa)}
	}
	if ask.ecs != nil {
		replyECS(m, ask, true)
	}
	w.WriteMsg(m)
	return dns.RcodeSuccess
}

// countPlaced counts an answer that depends on the client's place, by
// the distance of its nearest node.
func (p *PgCluster) countPlaced(ask *asker) {
	switch {
	case !ask.dependent:
	case !ask.mapped:
		p.topo.unmapped.Inc()
	case ask.nearest >= 0:
		p.topo.distance[ask.nearest].Inc()
	}
}

// zoneOf returns the zone of p that holds name (in lower case, as
// request.Name returns it), or "". Zones never overlap (setup refuses it),
// so the first that holds name is the one: a suffix at a label boundary,
// where plugin.Zones.Matches splits both names into labels on every query.
// A name with escapes (a dot inside a label) takes Matches' path.
func (p *PgCluster) zoneOf(name string) string {
	if strings.IndexByte(name, '\\') >= 0 {
		return plugin.Zones(p.Zones).Matches(name)
	}
	for _, z := range p.Zones {
		if z == "." || name == z || len(name) > len(z) && name[len(name)-len(z)-1] == '.' && strings.HasSuffix(name, z) {
			return z
		}
	}
	return ""
}

// answer fills m with the records for qtype of name, whose entry is e (see
// snapshot.lookup: under an alias al, the final cluster's entry of prefix),
// that fit b, following CNAMEs, and returns the response code.
func (p *PgCluster) answer(m *dns.Msg, b *budget, snap *snapshot, name string, e *entry, al *aliasPart, prefix string, qtype uint16) int {
	if e == nil {
		return dns.RcodeNameError
	}
	if qtype == dns.TypeANY {
		// RFC 8482: a minimal answer to ANY.
		m.Answer = []dns.RR{&dns.HINFO{Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeHINFO, Class: dns.ClassINET, Ttl: p.ttl}, Cpu: "RFC8482"}}
		return dns.RcodeSuccess
	}
	// A name under an alias is a CNAME to the same prefix under the
	// alias's target, unless it is an empty non-terminal.
	for hops := 0; al != nil && !e.ent; hops++ {
		if hops == maxChain {
			return dns.RcodeServerFailure
		}
		rr := &dns.CNAME{Hdr: hdr(name, dns.TypeCNAME, p.ttl), Target: prefix + al.target}
		m.Answer = append(m.Answer, rr)
		if qtype == dns.TypeCNAME {
			return dns.RcodeSuccess
		}
		b.cname(rr, hops)
		name = rr.Target
		next := snap.parts[al.target]
		if next == nil {
			return dns.RcodeServerFailure
		}
		al = next.alias
		if al == nil {
			e = next.entry(prefix)
			if e == nil {
				return dns.RcodeServerFailure
			}
		}
	}
	switch qtype {
	case dns.TypeA, dns.TypeAAAA, dns.TypeSRV:
		b.failOpen = e.failOpen
	}
	switch qtype {
	case dns.TypeA, dns.TypeAAAA:
		p.addresses(m, b, e, qtype)
	case dns.TypeSRV:
		p.services(m, b, e)
	case dns.TypeTXT:
		if e.txt != nil {
			m.Answer = append(m.Answer, copyRR(e.txt))
		}
	case dns.TypeNS:
		if e.apex != nil {
			m.Answer = appendCopies[dns.NS](m.Answer, e.apex.ns, 0, len(e.apex.ns))
			m.Extra = appendGlue(m.Extra, b, e.owner, e.apex.ns, e.apex.glue)
		}
	case dns.TypeSOA:
		if e.apex != nil && e.apex.soa != nil {
			m.Answer = append(m.Answer, copyRR(e.apex.soa))
		}
	}
	return dns.RcodeSuccess
}

// negative reports whether m says the name or its data does not exist: then
// the zone's SOA goes in the authority section (RFC 2308).
func negative(m *dns.Msg, qtype uint16) bool {
	if m.Rcode == dns.RcodeNameError || len(m.Answer) == 0 {
		return true
	}
	_, cname := m.Answer[len(m.Answer)-1].(*dns.CNAME)
	return cname && qtype != dns.TypeCNAME
}
