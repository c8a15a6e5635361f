package discoverytest

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"

	"github.com/miekg/dns"
)

// srvPrefix is where the SRV records of a name live.
const srvPrefix = "_postgresql._tcp."

// maxChase bounds the CNAME chain the server follows in one answer.
const maxChase = 8

// Node is one serving PostgreSQL node of a cluster.
type Node struct {
	// Name is the node's DNS label.
	Name string
	// Addr is where the node listens.
	Addr netip.AddrPort
	// Role is "primary", "standby" or empty.
	Role string
}

// zone holds the clusters and the records built from them. Names of the
// zone, for a cluster C and zone Z:
//
//	C.Z, primary.C.Z, standby.C.Z, replica.C.Z   A/AAAA of those nodes
//	_postgresql._tcp.<each of those>             SRV → NODE.C.Z, port
//	NODE.C.Z                                     A/AAAA of the node
//	ALIAS.Z, LABEL.ALIAS.Z                       CNAME → C.Z, LABEL.C.Z
//	primary.C.Z                                  TXT: the primary's state
//
// primary.C.Z has no address while two nodes claim to be primary, and
// names a held node (see HoldPrimary) while none does.
type zone struct {
	origin string

	mu       sync.Mutex
	ttl      uint32
	chase    bool
	noGlue   bool
	noState  bool
	clusters map[string][]Node
	held     map[string]Node
	aliases  map[string]string
	extra    []dns.RR
	names    map[string]map[uint16][]dns.RR
}

func newZone(origin string) *zone {
	z := &zone{
		origin:   dns.CanonicalName(origin),
		ttl:      30,
		chase:    true,
		clusters: make(map[string][]Node),
		held:     make(map[string]Node),
		aliases:  make(map[string]string),
	}
	z.build()
	return z
}

func (z *zone) setCluster(cluster string, nodes []Node) {
	z.update(func() {
		if len(nodes) == 0 {
			delete(z.clusters, cluster)
		} else {
			z.clusters[cluster] = append([]Node(nil), nodes...)
		}
	})
}

func (z *zone) setAlias(alias, target string) {
	z.update(func() {
		if target == "" {
			delete(z.aliases, alias)
		} else {
			z.aliases[alias] = target
		}
	})
}

func (z *zone) hold(cluster string, n *Node) {
	z.update(func() {
		if n == nil {
			delete(z.held, cluster)
		} else {
			z.held[cluster] = *n
		}
	})
}

func (z *zone) setTTL(ttl uint32)     { z.update(func() { z.ttl = ttl }) }
func (z *zone) setState(on bool)      { z.update(func() { z.noState = !on }) }
func (z *zone) setChase(on bool)      { z.update(func() { z.chase = on }) }
func (z *zone) setGlue(on bool)       { z.update(func() { z.noGlue = !on }) }
func (z *zone) setExtra(rrs []dns.RR) { z.update(func() { z.extra = rrs }) }

func (z *zone) update(change func()) {
	z.mu.Lock()
	defer z.mu.Unlock()
	change()
	z.build()
}

// build turns the clusters into records. Called with z.mu held.
func (z *zone) build() {
	z.names = make(map[string]map[uint16][]dns.RR)
	z.add(&dns.SOA{Hdr: z.hdr(z.origin, dns.TypeSOA), Ns: "ns." + z.origin, Mbox: "hostmaster." + z.origin,
		Serial: 1, Refresh: 3600, Retry: 600, Expire: 86400, Minttl: z.ttl})
	z.add(&dns.NS{Hdr: z.hdr(z.origin, dns.TypeNS), Ns: "ns." + z.origin})
	for cluster, nodes := range z.clusters {
		cz := dns.CanonicalName(cluster + "." + z.origin)
		var primaries, standbys []Node
		for _, n := range nodes {
			switch n.Role {
			case "primary":
				primaries = append(primaries, n)
			case "standby":
				standbys = append(standbys, n)
			}
			z.addAddr(dns.CanonicalName(n.Name+"."+cz), n.Addr.Addr())
		}
		state := primaryState(primaries)
		switch held, ok := z.held[cluster]; {
		case len(primaries) > 1:
			primaries = nil // split brain: nobody is the primary
		case len(primaries) == 0 && ok:
			primaries, state = []Node{held}, []string{"state=held", "node=" + held.Name}
			z.addAddr(dns.CanonicalName(held.Name+"."+cz), held.Addr.Addr())
		}
		z.addSet(cz, cz, nodes)
		z.addSet("primary."+cz, cz, primaries)
		if !z.noState {
			z.add(&dns.TXT{Hdr: z.hdr("primary."+cz, dns.TypeTXT), Txt: state})
		}
		z.addSet("standby."+cz, cz, standbys)
		z.addSet("replica."+cz, cz, standbys)
	}
	for _, rr := range z.extra {
		z.add(dns.Copy(rr)) // answers in flight still read the old copy
	}
}

// primaryState is the TXT of primary.C.Z for the nodes that claim to be
// primary, in the words pgcluster uses.
func primaryState(primaries []Node) []string {
	switch len(primaries) {
	case 0:
		return []string{"state=none"}
	case 1:
		return []string{"state=serving", "node=" + primaries[0].Name}
	}
	return []string{"state=split_brain", fmt.Sprintf("primaries=%d", len(primaries))}
}

// addSet publishes nodes at owner: their addresses and, one level down,
// their SRV records. The names exist even with no node.
func (z *zone) addSet(owner, cz string, nodes []Node) {
	z.touch(owner)
	z.touch(srvPrefix + owner)
	for _, n := range nodes {
		z.addAddr(owner, n.Addr.Addr())
		z.add(&dns.SRV{Hdr: z.hdr(srvPrefix+owner, dns.TypeSRV), Priority: 10, Weight: 10,
			Port: n.Addr.Port(), Target: dns.CanonicalName(n.Name + "." + cz)})
	}
}

func (z *zone) addAddr(owner string, ip netip.Addr) {
	for _, rr := range z.names[owner][dns.TypeA] {
		if rr.(*dns.A).A.Equal(net.IP(ip.AsSlice())) {
			return // several nodes on one address: one record
		}
	}
	for _, rr := range z.names[owner][dns.TypeAAAA] {
		if rr.(*dns.AAAA).AAAA.Equal(net.IP(ip.AsSlice())) {
			return
		}
	}
	if ip.Is4() {
		z.add(&dns.A{Hdr: z.hdr(owner, dns.TypeA), A: net.IP(ip.AsSlice())})
	} else {
		z.add(&dns.AAAA{Hdr: z.hdr(owner, dns.TypeAAAA), AAAA: net.IP(ip.AsSlice())})
	}
}

func (z *zone) touch(owner string) {
	if z.names[owner] == nil {
		z.names[owner] = make(map[uint16][]dns.RR)
	}
}

func (z *zone) add(rr dns.RR) {
	h := rr.Header()
	h.Name = dns.CanonicalName(h.Name)
	z.touch(h.Name)
	z.names[h.Name][h.Rrtype] = append(z.names[h.Name][h.Rrtype], rr)
}

func (z *zone) hdr(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: z.ttl}
}

// answer builds the reply to r.
func (z *zone) answer(r *dns.Msg) *dns.Msg {
	z.mu.Lock()
	defer z.mu.Unlock()
	m := new(dns.Msg)
	m.SetReply(r)
	q := r.Question[0]
	name := dns.CanonicalName(q.Name)
	if !dns.IsSubDomain(z.origin, name) {
		m.Rcode = dns.RcodeRefused
		return m
	}
	m.Authoritative = true
	for range maxChase {
		if target, ok := z.cname(name); ok && q.Qtype != dns.TypeCNAME {
			m.Answer = append(m.Answer, &dns.CNAME{Hdr: z.hdr(name, dns.TypeCNAME), Target: target})
			if !z.chase || !dns.IsSubDomain(z.origin, target) {
				return m
			}
			name = target
			continue
		}
		set, ok := z.names[name]
		if !ok {
			m.Rcode = dns.RcodeNameError
		}
		if len(set[q.Qtype]) == 0 {
			m.Ns = append(m.Ns, z.names[z.origin][dns.TypeSOA]...)
			return m
		}
		m.Answer = append(m.Answer, set[q.Qtype]...)
		for _, rr := range set[q.Qtype] {
			if srv, ok := rr.(*dns.SRV); ok && !z.noGlue {
				m.Extra = append(m.Extra, z.names[srv.Target][dns.TypeA]...)
				m.Extra = append(m.Extra, z.names[srv.Target][dns.TypeAAAA]...)
			}
		}
		return m
	}
	return m
}

// cname returns the target of name when it is a CNAME: a record set with
// SetRecords, an alias, or a name under an alias.
func (z *zone) cname(name string) (string, bool) {
	if rrs := z.names[name][dns.TypeCNAME]; len(rrs) > 0 {
		return dns.CanonicalName(rrs[0].(*dns.CNAME).Target), true
	}
	for alias, target := range z.aliases {
		az := dns.CanonicalName(alias + "." + z.origin)
		tz := dns.CanonicalName(target + "." + z.origin)
		if name == az {
			return tz, true
		}
		if prefix, ok := strings.CutSuffix(name, "."+az); ok {
			return prefix + "." + tz, true
		}
	}
	return "", false
}
