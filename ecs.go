package pgcluster

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/coredns/coredns/request"

	"github.com/miekg/dns"
)

// Address families of an ECS option (RFC 7871 §6).
const (
	ecsFamilyIPv4 = 1
	ecsFamilyIPv6 = 2
)

// asker is who is asking, with topology on: the address its place is
// looked up by (the ECS address when the query carries one, else the
// packet's source), what placed it, and, filled in by the answer, whether
// the answer depends on the place and how near its nearest node is.
type asker struct {
	addr netip.Addr
	bits int               // of addr that count: the ECS SOURCE PREFIX-LENGTH, or the whole address
	ecs  *dns.EDNS0_SUBNET // the query's option, nil without
	net  int32             // the network that placed it in the snapshot's placeMap, -1 none
	place
	mapped bool // a network with a region or zone holds it
	scope  int  // the lookup's scope (see placeMap.lookup)

	dependent bool // the answer depends on the client's place
	// segmented: answered from the client's segment's verdicts
	// (check_scope zone or region): every answer may depend on its place.
	segmented bool
	nearest   int // the distance of the first node answered, -1 none yet
}

// answered notes that an answer's first node is at distance d.
func (a *asker) answered(d int) {
	if a.nearest < 0 {
		a.nearest = d
	}
}

// errECS is a malformed ECS option: answered FORMERR (RFC 7871 §7.1.2).
type errECS string

func (e errECS) Error() string { return "malformed EDNS Client Subnet option: " + string(e) }

// queryECS returns r's ECS option, nil when it has none, or why it is
// malformed: a second option, a family other than IPv4 and IPv6 (0 only
// with SOURCE 0, as dig sends), a SOURCE PREFIX-LENGTH beyond the
// family's bits, ADDRESS octets other than the prefix needs, or bits set
// beyond the prefix.
func queryECS(r *dns.Msg) (*dns.EDNS0_SUBNET, error) {
	o := r.IsEdns0()
	if o == nil {
		return nil, nil
	}
	var ecs *dns.EDNS0_SUBNET
	for _, opt := range o.Option {
		if s, ok := opt.(*dns.EDNS0_SUBNET); ok {
			if ecs != nil {
				return nil, errECS("more than one")
			}
			ecs = s
		}
	}
	if ecs == nil {
		return nil, nil
	}
	var addr netip.Addr
	switch ecs.Family {
	case 0:
		if ecs.SourceNetmask != 0 {
			return nil, errECS("family 0 with a source prefix")
		}
		return ecs, nil
	case ecsFamilyIPv4:
		a, ok := netip.AddrFromSlice(ecs.Address.To4())
		if !ok || ecs.SourceNetmask > 32 {
			return nil, errECS("an IPv4 source prefix longer than 32 bits")
		}
		addr = a
	case ecsFamilyIPv6:
		a, ok := netip.AddrFromSlice(ecs.Address.To16())
		if !ok || ecs.SourceNetmask > 128 {
			return nil, errECS("an IPv6 source prefix longer than 128 bits")
		}
		addr = a
	default:
		return nil, errECS(fmt.Sprintf("family %d", ecs.Family))
	}
	if p := netip.PrefixFrom(addr, int(ecs.SourceNetmask)); p.Masked().Addr() != addr {
		return nil, errECS("address bits set beyond the source prefix")
	}
	// miekg/dns keeps ADDRESS in a whole address, which hides how many
	// octets came: the OPT record's RDLENGTH as received does not. Each
	// option packs again to the length it came with, the ECS option to
	// exactly the octets its prefix needs, so a received ADDRESS of more or
	// fewer octets makes the two lengths differ. (0: a message made here,
	// never received.)
	if o.Hdr.Rdlength != 0 && int(o.Hdr.Rdlength) != dns.Len(o)-optHeaderLen {
		return nil, errECS("address octets other than the source prefix needs")
	}
	return ecs, nil
}

// optHeaderLen is the OPT record's length before its data: the root name,
// then type, class, TTL and RDLENGTH.
const optHeaderLen = 1 + rrFixedLen

// newAsker finds who is asking state's question in places: the ECS
// address when the query carries one (SOURCE 0: nobody, unmapped), else
// the packet's source address.
func newAsker(state request.Request, ecs *dns.EDNS0_SUBNET, places *placeMap) *asker {
	a := &asker{ecs: ecs, net: -1, nearest: -1}
	if ecs != nil {
		if ecs.SourceNetmask == 0 {
			return a
		}
		if ecs.Family == ecsFamilyIPv4 {
			a.addr, _ = netip.AddrFromSlice(ecs.Address.To4())
		} else {
			a.addr, _ = netip.AddrFromSlice(ecs.Address.To16())
		}
		a.bits = int(ecs.SourceNetmask)
	} else {
		a.addr = sourceAddr(state.W.RemoteAddr())
		a.bits = a.addr.BitLen()
	}
	if !a.addr.IsValid() {
		return a
	}
	var id placeID
	a.net, id, a.scope = places.lookup(a.addr, a.bits)
	a.place = places.places[id]
	a.mapped = id != 0
	return a
}

// sourceAddr is a packet's source address, unmapped; invalid when unknown.
func sourceAddr(addr net.Addr) netip.Addr {
	switch x := addr.(type) {
	case *net.UDPAddr:
		return x.AddrPort().Addr().Unmap()
	case *net.TCPAddr:
		return x.AddrPort().Addr().Unmap()
	}
	if ap, err := netip.ParseAddrPort(addr.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// replyECS adds to m the OPT record of the reply to an ECS query: FAMILY,
// SOURCE PREFIX-LENGTH and ADDRESS echoed, SCOPE PREFIX-LENGTH the
// asker's scope when the answer depends on where the client is, else 0
// (RFC 7871 §7.2.1). CoreDNS's writer keeps an OPT record the reply has,
// setting its size and DO bit from the query's.
func replyECS(m *dns.Msg, a *asker, client bool) {
	scope := uint8(0)
	switch {
	case a.ecs.SourceNetmask == 0:
	case client:
		// _client's answer names the address itself.
		scope = a.ecs.SourceNetmask
	case a.dependent || a.segmented:
		scope = uint8(a.scope)
	}
	// One allocation for the record, its option list and the option.
	r := &ecsReply{opt: dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}},
		ecs: dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: a.ecs.Family,
			SourceNetmask: a.ecs.SourceNetmask, SourceScope: scope, Address: a.ecs.Address}}
	r.options[0] = &r.ecs
	r.opt.Option = r.options[:]
	m.Extra = append(m.Extra, &r.opt)
}

// ecsReply is the OPT record of a reply to an ECS query, with its option.
type ecsReply struct {
	opt     dns.OPT
	options [1]dns.EDNS0
	ecs     dns.EDNS0_SUBNET
}

// clientTXT is the TXT record of _client.<zone>: the address this instance
// placed the asker by (from ECS or the packet), the network that placed
// it, its region and zone.
func clientTXT(owner string, ttl uint32, a *asker, places *placeMap) *dns.TXT {
	from := "source"
	if a.ecs != nil {
		from = "ecs"
	}
	addr := "none"
	if a.addr.IsValid() {
		addr = netip.PrefixFrom(a.addr, a.bits).String()
	}
	network := "none"
	if a.net >= 0 {
		network = places.networks[a.net].Network.String()
	}
	return &dns.TXT{Hdr: hdr(owner, dns.TypeTXT, ttl), Txt: []string{
		"address=" + addr, "from=" + from, "network=" + network,
		"region=" + dash(a.region), "zone=" + dash(a.zone), fmt.Sprintf("scope=%d", a.scope),
	}}
}

// dash is s, or "-" when empty.
func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
