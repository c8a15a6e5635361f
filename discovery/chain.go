package discovery

import (
	"context"
	"fmt"
	"math"

	"github.com/miekg/dns"
)

// maxCNAMEHops bounds a CNAME chain, across one or several replies.
const maxCNAMEHops = 8

// rrset is the outcome of a query after its CNAME chain was followed.
type rrset struct {
	canonical string   // the name at the end of the chain
	rrs       []dns.RR // records of the asked type owned by canonical
	extra     []dns.RR // the additional sections of the replies
	ttl       uint32   // smallest TTL of the CNAMEs and rrs, or the negative TTL
	rcode     int      // of the last reply
	truncated bool     // the last reply had the TC bit (over TCP: a partial set)
}

// lookup asks for name and qtype and follows the CNAME chain: within the
// reply when the server included the target's records (as an authoritative
// server does for names in its zone), with a new query when it did not.
func (r *Resolver) lookup(ctx context.Context, name string, qtype uint16) (rrset, error) {
	out := rrset{canonical: dns.Fqdn(name), ttl: math.MaxUint32}
	hops := 0
	for {
		asked := out.canonical
		reply, err := r.Query(ctx, asked, qtype)
		if err != nil {
			return out, err
		}
		out.canonical, hops, err = followCNAMEs(reply.Answer, asked, hops, &out.ttl)
		if err != nil {
			return out, err
		}
		for _, rr := range reply.Answer {
			h := rr.Header()
			if h.Rrtype == qtype && equalName(h.Name, out.canonical) {
				out.rrs = append(out.rrs, rr)
				out.ttl = min(out.ttl, h.Ttl)
			}
		}
		out.extra = append(out.extra, reply.Extra...)
		out.rcode, out.truncated = reply.Rcode, reply.Truncated
		if len(out.rrs) > 0 || out.canonical == asked || reply.Rcode != dns.RcodeSuccess {
			if len(out.rrs) == 0 {
				out.ttl = min(out.ttl, negativeTTL(reply))
			}
			return out, nil
		}
		// The chain ends at a name whose records were not in the reply.
	}
}

// followCNAMEs walks the CNAME records of answer from name and returns the
// last name reached and the number of hops taken so far.
func followCNAMEs(answer []dns.RR, name string, hops int, ttl *uint32) (string, int, error) {
	for {
		next := ""
		for _, rr := range answer {
			if c, ok := rr.(*dns.CNAME); ok && equalName(c.Hdr.Name, name) {
				next = dns.Fqdn(c.Target)
				*ttl = min(*ttl, c.Hdr.Ttl)
				break
			}
		}
		if next == "" {
			return name, hops, nil
		}
		hops++
		if hops > maxCNAMEHops {
			return name, hops, fmt.Errorf("discovery: CNAME chain longer than %d at %s", maxCNAMEHops, name)
		}
		name = next
	}
}

// negativeTTL is how long an empty answer may be cached (RFC 2308): the
// smaller of the SOA's TTL and its MINIMUM field, or 0 without a SOA.
func negativeTTL(reply *dns.Msg) uint32 {
	for _, rr := range reply.Ns {
		if soa, ok := rr.(*dns.SOA); ok {
			return min(soa.Hdr.Ttl, soa.Minttl)
		}
	}
	return 0
}

// equalName compares two domain names, ignoring case.
func equalName(a, b string) bool { return dns.CanonicalName(a) == dns.CanonicalName(b) }
