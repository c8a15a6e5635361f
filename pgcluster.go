// Package pgcluster is a CoreDNS plugin that serves an authoritative zone for
// PostgreSQL clusters from a peer-registry table kept in PostgreSQL.
package pgcluster

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/pkg/fall"
	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"
)

// maxChain bounds the CNAME hops followed inside one answer.
const maxChain = 8

// PgCluster is the plugin handler.
type PgCluster struct {
	Next  plugin.Handler
	Zones []string
	Fall  fall.F

	ttl  uint32
	snap atomic.Pointer[snapshot]
	// rotate turns the order of A and AAAA records, one step per query.
	rotate atomic.Uint32

	reg *registry
}

var _ plugin.Handler = (*PgCluster)(nil)

var errNotLoaded = errors.New("registry not loaded yet")

// Name implements plugin.Handler.
func (p *PgCluster) Name() string { return "pgcluster" }

// ServeDNS implements plugin.Handler. It reads the current snapshot and
// answers from it: no lock, no I/O.
func (p *PgCluster) ServeDNS(ctx context.Context, w dns.ResponseWriter, r *dns.Msg) (int, error) {
	state := request.Request{W: w, Req: r}
	qname := state.Name()
	zone := plugin.Zones(p.Zones).Matches(qname)
	if zone == "" {
		return plugin.NextOrFailure(p.Name(), p.Next, ctx, w, r)
	}
	snap := p.snap.Load()
	if snap == nil {
		return dns.RcodeServerFailure, errNotLoaded
	}
	e := snap.names[qname]
	if e == nil && p.Fall.Through(qname) {
		return plugin.NextOrFailure(p.Name(), p.Next, ctx, w, r)
	}

	m := new(dns.Msg)
	m.SetReply(r)
	m.Authoritative = true
	m.Rcode = p.answer(m, e, state.QType())
	if negative(m, state.QType()) {
		m.Ns = []dns.RR{snap.names[zone].soa}
	}
	w.WriteMsg(m)
	return dns.RcodeSuccess, nil
}

// answer fills m with the records of e for qtype, following CNAMEs, and
// returns the response code.
func (p *PgCluster) answer(m *dns.Msg, e *entry, qtype uint16) int {
	if e == nil {
		return dns.RcodeNameError
	}
	if qtype == dns.TypeANY {
		// RFC 8482: a minimal answer to ANY.
		m.Answer = []dns.RR{&dns.HINFO{Hdr: dns.RR_Header{Name: m.Question[0].Name, Rrtype: dns.TypeHINFO, Class: dns.ClassINET, Ttl: p.ttl}, Cpu: "RFC8482"}}
		return dns.RcodeSuccess
	}
	for hops := 0; e.cname != nil && qtype != dns.TypeCNAME; hops++ {
		if hops == maxChain || e.next == nil {
			return dns.RcodeServerFailure
		}
		m.Answer = append(m.Answer, e.cname)
		e = e.next
	}
	switch qtype {
	case dns.TypeA:
		m.Answer = p.rotated(m.Answer, e.a)
	case dns.TypeAAAA:
		m.Answer = p.rotated(m.Answer, e.aaaa)
	case dns.TypeTXT:
		m.Answer = append(m.Answer, e.txt...)
	case dns.TypeSRV:
		m.Answer = append(m.Answer, e.srv...)
		m.Extra = e.extra
	case dns.TypeNS:
		m.Answer = append(m.Answer, e.ns...)
	case dns.TypeSOA:
		if e.soa != nil {
			m.Answer = append(m.Answer, e.soa)
		}
	case dns.TypeCNAME:
		if e.cname != nil {
			m.Answer = append(m.Answer, e.cname)
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

// rotated appends rrs to ans, starting one further along on each call, so
// that clients which take the first address spread over all of them.
func (p *PgCluster) rotated(ans, rrs []dns.RR) []dns.RR {
	n := len(rrs)
	if n == 0 {
		return ans
	}
	if ans == nil {
		ans = make([]dns.RR, 0, n)
	}
	k := int(p.rotate.Add(1) % uint32(n))
	ans = append(ans, rrs[k:]...)
	return append(ans, rrs[:k]...)
}
