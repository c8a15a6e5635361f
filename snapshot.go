package pgcluster

import (
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/health"
)

// entry is one owner name of the zone with every record it has.
type entry struct {
	a, aaaa []dns.RR
	txt     []dns.RR
	srv     []dns.RR
	extra   []dns.RR // the glue: extra[i] is the address of srv[i]'s target
	ns      []dns.RR
	soa     *dns.SOA
	// failOpen: the addresses and SRV records are of nodes that fail their
	// check, answered because all of the set's nodes do (all_down open).
	failOpen bool

	cname  *dns.CNAME
	target string // owner name the CNAME points to
	next   *entry // entry of target
}

// clusterStat is what metrics and logs report of one cluster.
type clusterStat struct {
	serving, out int
	primaries    []string
}

// snapshot is an immutable view of every name pgcluster answers. The query
// path reads it without locks; a change publishes a new one.
type snapshot struct {
	names    map[string]*entry
	zones    []string
	serial   uint32
	hash     uint64
	loadedAt time.Time
	clusters map[string]clusterStat
	skipped  []skipped
	// verdicts says of each node ("cluster/name") whether it is served, and why.
	verdicts map[string]string
	// targets are the nodes to check, when checks are on.
	targets []health.Target
	// failOpen counts the sets answered with nodes that fail their check,
	// because every node of the set does (all_down open).
	failOpen int
}

// buildInput is everything a snapshot is made from.
type buildInput struct {
	*settings
	nodes   []Node
	aliases []Alias
	// view is the checks' verdicts by "cluster/name"; a node missing from
	// it is not checked yet.
	view health.View
}

// build turns registry rows into a snapshot. It is a pure function of its
// input: no I/O, no clock, no randomness. The serial is set by the caller.
func build(in buildInput) *snapshot {
	s := &snapshot{
		names:    make(map[string]*entry),
		zones:    in.zones,
		clusters: make(map[string]clusterStat),
		verdicts: make(map[string]string),
	}
	zoneLen := 0 // in octets on the wire, of the longest zone
	for _, z := range in.zones {
		zoneLen = max(zoneLen, len(z)+1)
	}
	clusters := s.validateNodes(in, zoneLen)
	aliases := s.resolveAliases(in.aliases, clusters, zoneLen)

	for _, z := range in.zones {
		b := &builder{s: s, in: in, zone: z, owners: map[string][]string{}}
		b.apex()
		for _, c := range clusters {
			b.cluster(c)
		}
		for _, a := range aliases {
			b.alias(a.alias, a.target, a.final)
		}
	}
	s.addEmptyNonTerminals(in.zones)
	s.link()
	s.hash = contentHash(clusters, aliases)
	return s
}

// builder writes the names of one zone.
type builder struct {
	s    *snapshot
	in   buildInput
	zone string
	// owners holds, by cluster, the names written under it, so that an
	// alias twins its target's names without scanning the whole zone.
	owners map[string][]string
	cur    string // the cluster being written, "" outside one
}

func (b *builder) name(labels ...string) string {
	return strings.Join(append(labels, b.zone), ".")
}

func (b *builder) entry(name string) *entry {
	e := b.s.names[name]
	if e == nil {
		e = &entry{}
		b.s.names[name] = e
		if b.cur != "" {
			b.owners[b.cur] = append(b.owners[b.cur], name)
		}
	}
	return e
}

func (b *builder) hdr(name string, t uint16) dns.RR_Header {
	return dns.RR_Header{Name: name, Rrtype: t, Class: dns.ClassINET, Ttl: b.in.ttl}
}

func (b *builder) apex() {
	e := b.entry(b.zone)
	ns := b.name(labelNS)
	e.ns = []dns.RR{&dns.NS{Hdr: b.hdr(b.zone, dns.TypeNS), Ns: ns}}
	b.addresses(b.entry(ns), ns, b.in.nsAddrs)
}

// addresses adds A and AAAA records for addrs to e.
func (b *builder) addresses(e *entry, name string, addrs []netip.Addr) {
	for _, a := range addrs {
		if a.Is4() {
			e.a = append(e.a, &dns.A{Hdr: b.hdr(name, dns.TypeA), A: net.IP(a.AsSlice())})
		} else {
			e.aaaa = append(e.aaaa, &dns.AAAA{Hdr: b.hdr(name, dns.TypeAAAA), AAAA: net.IP(a.AsSlice())})
		}
	}
}

func (b *builder) cluster(c *cluster) {
	b.cur = c.name
	defer func() { b.cur = "" }()
	serving := func(m *member) bool { return m.serving }
	// down: a node the registry allows but whose check fails; all_down
	// open answers these when none of a set serves.
	down := func(m *member) bool { return m.registryOK && !m.serving }
	for _, m := range c.members {
		nodeName := b.name(m.Name, c.name)
		e := b.entry(nodeName)
		if m.serving {
			b.addresses(e, nodeName, []netip.Addr{m.addr})
		}
		e.txt = []dns.RR{&dns.TXT{Hdr: b.hdr(nodeName, dns.TypeTXT), Txt: nodeTXT(m, len(b.s.clusters[c.name].primaries), b.in.settings)}}
	}
	all, allOpen := b.pick(c, serving), b.pick(c, down)
	primaries := b.pick(c, func(m *member) bool { return serving(m) && m.Role == rolePrimary })
	primaryOpen := b.pick(c, func(m *member) bool { return down(m) && lastRole(m) == rolePrimary })
	standbys := b.pick(c, func(m *member) bool { return serving(m) && m.Role == roleStandby && !m.lagging })
	standbyOpen := b.pick(c, func(m *member) bool { return down(m) && lastRole(m) == roleStandby })
	var primary []*member
	switch {
	case len(primaries) == 1:
		primary = primaries
	case len(primaries) > 1:
		// Split brain: no address, and no fail-open either.
		primaryOpen = nil
	}
	if len(primaryOpen) > 1 {
		primaryOpen = nil
	}
	preferStandby, preferOpen := standbys, standbyOpen
	if len(preferStandby) == 0 && len(primary) == 1 {
		preferStandby, preferOpen = primary, nil
	} else if len(preferStandby) == 0 && len(preferOpen) == 0 {
		preferOpen = primaryOpen
	}
	b.set(c.name, "", all, allOpen)
	b.set(c.name, labelPrimary, primary, primaryOpen)
	b.set(c.name, labelStandby, standbys, standbyOpen)
	b.set(c.name, labelReplica, standbys, standbyOpen)
	b.set(c.name, labelPreferStandby, preferStandby, preferOpen)
	st := b.s.clusters[c.name]
	ce := b.entry(b.name(c.name))
	ce.txt = []dns.RR{&dns.TXT{Hdr: b.hdr(b.name(c.name), dns.TypeTXT), Txt: clusterTXT(st)}}
}

// set writes a set name (the cluster itself, or a role under it) with the
// addresses of members and an SRV record for each.
func (b *builder) set(clusterName, label string, members, open []*member) {
	owner := b.name(clusterName)
	if label != "" {
		owner = b.name(label, clusterName)
	}
	e := b.entry(owner)
	srvName := labelSRV + "." + owner
	se := b.entry(srvName)
	if len(members) == 0 && len(open) > 0 && b.in.allDown == allDownOpen {
		members = open
		e.failOpen, se.failOpen = true, true
		b.s.failOpen++
	}
	for _, m := range members {
		b.addresses(e, owner, []netip.Addr{m.addr})
		target := b.name(m.Name, clusterName)
		se.srv = append(se.srv, &dns.SRV{Hdr: b.hdr(srvName, dns.TypeSRV), Priority: 0, Weight: 10, Port: uint16(m.Port), Target: target})
		// A serving member has one address: its record is srv's glue.
		var glue entry
		b.addresses(&glue, target, []netip.Addr{m.addr})
		se.extra = append(append(se.extra, glue.a...), glue.aaaa...)
	}
}

// alias writes the names under alias: each name under the final cluster gets
// a twin under the alias, a CNAME to the same label under target.
func (b *builder) alias(alias, target, final string) {
	finalApex := b.name(final)
	owners := slices.Sorted(slices.Values(b.owners[final]))
	for _, name := range owners {
		prefix := strings.TrimSuffix(strings.TrimSuffix(name, finalApex), ".")
		from, to := b.name(alias), b.name(target)
		if prefix != "" {
			from, to = prefix+"."+from, prefix+"."+to
		}
		e := b.entry(from)
		e.cname = &dns.CNAME{Hdr: b.hdr(from, dns.TypeCNAME), Target: to}
		e.target = to
	}
}

// pick returns the members of c for which keep holds, in order.
func (b *builder) pick(c *cluster, keep func(*member) bool) []*member {
	var out []*member
	for _, m := range c.members {
		if keep(m) {
			out = append(out, m)
		}
	}
	return out
}

// lastRole is the role a node had when last known: read by its check
// before it failed, else the registry's.
func lastRole(m *member) string {
	if m.check.Role != "" {
		return m.check.Role
	}
	return m.Role
}

// addEmptyNonTerminals makes every name between an owner and its zone exist,
// so that it answers NODATA rather than NXDOMAIN.
func (s *snapshot) addEmptyNonTerminals(zones []string) {
	for _, z := range zones {
		for name := range s.names {
			if !dns.IsSubDomain(z, name) {
				continue
			}
			for p := parent(name); p != "" && len(p) > len(z); p = parent(p) {
				if _, ok := s.names[p]; !ok {
					s.names[p] = &entry{}
				}
			}
		}
	}
}

func parent(name string) string {
	i := strings.IndexByte(name, '.')
	if i < 0 || i == len(name)-1 {
		return ""
	}
	return name[i+1:]
}

// link points every CNAME at its target's entry.
func (s *snapshot) link() {
	for _, e := range s.names {
		if e.cname != nil {
			e.next = s.names[e.target]
		}
	}
}

// contentHash fingerprints what the records are made of: every served row
// with its verdict (the check's state and cause, whether a standby lags; never
// a WAL position or a lag in bytes), and every alias. With the instance's own settings fixed,
// equal hashes mean equal records, so the serial changes only when the
// content does.
func contentHash(clusters []*cluster, aliases []resolvedAlias) uint64 {
	h := fnv.New64a()
	for _, c := range clusters {
		for _, m := range c.members {
			fmt.Fprintf(h, "%s/%s %s %d %s %s %t %s %s %t\n", c.name, m.Name, m.Address, m.Port, m.Role, m.addr, m.serving, m.reason, m.check.State, m.lagging)
		}
	}
	for _, a := range aliases {
		fmt.Fprintf(h, "%s>%s\n", a.alias, a.target)
	}
	return h.Sum64()
}

// setSerial writes the SOA record of every zone apex with serial.
func (s *snapshot) setSerial(serial uint32, ttl uint32) {
	s.serial = serial
	for _, z := range s.zones {
		s.names[z].soa = &dns.SOA{
			Hdr:     dns.RR_Header{Name: z, Rrtype: dns.TypeSOA, Class: dns.ClassINET, Ttl: ttl},
			Ns:      labelNS + "." + z,
			Mbox:    "hostmaster." + z,
			Serial:  serial,
			Refresh: 3600,
			Retry:   600,
			Expire:  86400,
			Minttl:  ttl,
		}
	}
}
