package pgcluster

import (
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Node is one row of pgcluster_nodes, as loaded.
type Node struct {
	Cluster string
	Name    string
	Address netip.Addr
	// Network is set when the registry stored the address with a mask
	// shorter than a host's (inet '10.1.0.0/16'): a network, never served.
	Network netip.Prefix
	Port    int
	Role    string
	Healthy bool
	// HeartbeatAge is how old the heartbeat was when the row was read,
	// measured by PostgreSQL's own clock. Heartbeats too old or too far in
	// the future for a time.Duration are clamped to its bounds.
	HeartbeatAge time.Duration
}

// Alias is one row of pgcluster_aliases.
type Alias struct {
	Alias  string
	Target string
}

// Roles and the reserved labels inside a cluster.
const (
	rolePrimary = "primary"
	roleStandby = "standby"

	labelPrimary       = "primary"
	labelStandby       = "standby"
	labelReplica       = "replica"
	labelPreferStandby = "prefer-standby"
	labelSRV           = "_postgresql._tcp"
	labelNS            = "ns"
)

// reservedInCluster are labels a node may not take.
var reservedInCluster = map[string]bool{
	labelPrimary: true, labelStandby: true, labelReplica: true, labelPreferStandby: true,
}

// Skip reasons, the values of the rows_skipped metric's reason label.
const (
	skipInvalidName   = "invalid_name"
	skipReservedName  = "reserved_name"
	skipDuplicate     = "duplicate"
	skipAliasLoop     = "alias_loop"
	skipAliasDangling = "alias_dangling"
	skipAliasTooDeep  = "alias_too_deep"
	skipNameTooLong   = "name_too_long"
)

// skipped is a row that could not be served, and why.
type skipped struct {
	reason string
	what   string
}

func (s skipped) String() string { return s.what + " (" + s.reason + ")" }

// entry is one owner name of the zone with every record it has.
type entry struct {
	a, aaaa []dns.RR
	txt     []dns.RR
	srv     []dns.RR
	extra   []dns.RR // the glue: extra[i] is the address of srv[i]'s target
	ns      []dns.RR
	soa     *dns.SOA

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
}

// buildInput is everything a snapshot is made from.
type buildInput struct {
	zones         []string
	nodes         []Node
	aliases       []Alias
	ttl           uint32
	staleAfter    time.Duration
	allowLoopback bool
	// self maps a node name (or cluster/name) to the address to advertise
	// instead of its loopback address.
	self map[string]netip.Addr
	// nsAddrs are this instance's own addresses, for ns.<zone>.
	nsAddrs []netip.Addr
}

// member is a node that passed validation, with its verdict.
type member struct {
	Node
	addr    netip.Addr // the address to advertise
	serving bool
	reason  string // a stable word: see verdict.go
	detail  string // for TXT: what a person reads, numbers included
}

// cluster is one cluster's validated members.
type cluster struct {
	name    string
	members []*member
}

// Bounds of owner names, in octets on the wire (RFC 1035 3.1): a name
// holds at most 255, and the longest prefix pgcluster puts before a set's
// name is "_postgresql._tcp.prefer-standby.".
const (
	maxNameLen   = 255
	setPrefixLen = len(labelSRV) + 1 + len(labelPreferStandby) + 1
)

// longest is the longest prefix of a name under the cluster, in octets on
// the wire: a set's SRV name or a node's name.
func (c *cluster) longest() int {
	n := setPrefixLen
	for _, m := range c.members {
		n = max(n, len(m.Name)+1)
	}
	return n
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
		b := &builder{s: s, in: in, zone: z}
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

// validateNodes drops rows that cannot be served and decides which of the
// rest serve.
func (s *snapshot) validateNodes(in buildInput, zoneLen int) []*cluster {
	byName := map[string]*cluster{}
	var order []*cluster
	nodes := append([]Node(nil), in.nodes...)
	// Sort by name as served; of two rows that differ only in case, the one
	// already in lower case wins.
	key := func(n Node) string { return strings.ToLower(n.Cluster) + "/" + strings.ToLower(n.Name) }
	canonical := func(n Node) bool { return n.Cluster+"/"+n.Name == key(n) }
	sort.SliceStable(nodes, func(i, j int) bool {
		if ki, kj := key(nodes[i]), key(nodes[j]); ki != kj {
			return ki < kj
		}
		return canonical(nodes[i]) && !canonical(nodes[j])
	})
	seen := map[string]bool{}
	for _, n := range nodes {
		what := fmt.Sprintf("node %q in cluster %q", n.Name, n.Cluster)
		cl, nl := strings.ToLower(n.Cluster), strings.ToLower(n.Name)
		switch {
		case !isLabel(cl) || !isLabel(nl):
			s.skip(skipInvalidName, what)
			continue
		case cl == labelNS || reservedInCluster[nl]:
			s.skip(skipReservedName, what)
			continue
		case seen[cl+"/"+nl]:
			s.skip(skipDuplicate, what)
			continue
		case zoneLen+len(nl)+1+len(cl)+1 > maxNameLen || zoneLen+setPrefixLen+len(cl)+1 > maxNameLen:
			s.skip(skipNameTooLong, what+": its names would be longer than 255 octets")
			continue
		}
		seen[cl+"/"+nl] = true
		n.Cluster, n.Name, n.Role = cl, nl, printable(strings.ToLower(strings.TrimSpace(n.Role)), maxRole)
		c := byName[cl]
		if c == nil {
			c = &cluster{name: cl}
			byName[cl] = c
			order = append(order, c)
		}
		m := judge(n, in)
		c.members = append(c.members, m)
		s.verdicts[cl+"/"+nl] = m.verdict()
	}
	for _, c := range order {
		st := clusterStat{}
		for _, m := range c.members {
			if m.serving {
				st.serving++
				if m.Role == rolePrimary {
					st.primaries = append(st.primaries, m.Name)
				}
			} else {
				st.out++
			}
		}
		s.clusters[c.name] = st
	}
	return order
}

// resolvedAlias is an alias whose chain ends at a cluster.
type resolvedAlias struct {
	alias, target, final string
	depth                int
}

// resolveAliases follows every alias to its cluster and orders them so that
// an alias comes after the alias it points to.
func (s *snapshot) resolveAliases(rows []Alias, clusters []*cluster, zoneLen int) []resolvedAlias {
	byName := map[string]*cluster{}
	for _, c := range clusters {
		byName[c.name] = c
	}
	target := map[string]string{}
	rows = append([]Alias(nil), rows...)
	// Of two aliases that differ only in case, the one already in lower case
	// wins, as for nodes.
	sort.SliceStable(rows, func(i, j int) bool {
		ai, aj := strings.ToLower(rows[i].Alias), strings.ToLower(rows[j].Alias)
		if ai != aj {
			return ai < aj
		}
		return rows[i].Alias == ai && rows[j].Alias != aj
	})
	for _, r := range rows {
		a, t := strings.ToLower(r.Alias), strings.ToLower(strings.TrimSuffix(r.Target, "."))
		what := fmt.Sprintf("alias %q -> %q", r.Alias, r.Target)
		switch {
		case !isLabel(a) || !isLabel(t):
			s.skip(skipInvalidName, what)
		case a == labelNS:
			s.skip(skipReservedName, what)
		case byName[a] != nil:
			s.skip(skipDuplicate, what+": a cluster has that name")
		case target[a] != "":
			s.skip(skipDuplicate, what)
		default:
			target[a] = t
		}
	}
	var out []resolvedAlias
	resolved := map[string]bool{}
	for _, r := range rows {
		a := strings.ToLower(r.Alias)
		t, ok := target[a]
		if !ok || resolved[a] {
			continue
		}
		resolved[a] = true
		what := fmt.Sprintf("alias %q -> %q", r.Alias, r.Target)
		cur, depth := t, 1
		path := []string{a}
		for ; byName[cur] == nil; depth++ {
			next, ok := target[cur]
			path = append(path, cur)
			switch {
			case !ok:
				s.skip(skipAliasDangling, what+": no cluster or alias "+cur)
			case slices.Contains(path, next):
				s.skip(skipAliasLoop, what)
			case depth >= maxChain:
				s.skip(skipAliasTooDeep, fmt.Sprintf("%s: more than %d aliases to a cluster", what, maxChain))
			default:
				cur = next
				continue
			}
			break
		}
		c := byName[cur]
		if c == nil {
			continue
		}
		if zoneLen+c.longest()+len(a)+1 > maxNameLen {
			s.skip(skipNameTooLong, what+": its names would be longer than 255 octets")
			continue
		}
		out = append(out, resolvedAlias{alias: a, target: t, final: cur, depth: depth})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].depth < out[j].depth })
	return out
}

func (s *snapshot) skip(reason, what string) {
	s.skipped = append(s.skipped, skipped{reason: reason, what: what})
}

// builder writes the names of one zone.
type builder struct {
	s    *snapshot
	in   buildInput
	zone string
}

func (b *builder) name(labels ...string) string {
	return strings.Join(append(labels, b.zone), ".")
}

func (b *builder) entry(name string) *entry {
	e := b.s.names[name]
	if e == nil {
		e = &entry{}
		b.s.names[name] = e
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
	var all, primaries, standbys []*member
	for _, m := range c.members {
		nodeName := b.name(m.Name, c.name)
		e := b.entry(nodeName)
		if m.serving {
			all = append(all, m)
			b.addresses(e, nodeName, []netip.Addr{m.addr})
			switch m.Role {
			case rolePrimary:
				primaries = append(primaries, m)
			case roleStandby:
				standbys = append(standbys, m)
			}
		}
		e.txt = []dns.RR{&dns.TXT{Hdr: b.hdr(nodeName, dns.TypeTXT), Txt: nodeTXT(m, len(b.s.clusters[c.name].primaries))}}
	}
	var primary []*member
	if len(primaries) == 1 {
		primary = primaries
	}
	preferStandby := standbys
	if len(preferStandby) == 0 {
		preferStandby = primary
	}
	b.set(c.name, "", all)
	b.set(c.name, labelPrimary, primary)
	b.set(c.name, labelStandby, standbys)
	b.set(c.name, labelReplica, standbys)
	b.set(c.name, labelPreferStandby, preferStandby)
	st := b.s.clusters[c.name]
	ce := b.entry(b.name(c.name))
	ce.txt = []dns.RR{&dns.TXT{Hdr: b.hdr(b.name(c.name), dns.TypeTXT), Txt: clusterTXT(st)}}
}

// set writes a set name (the cluster itself, or a role under it) with the
// addresses of members and an SRV record for each.
func (b *builder) set(clusterName, label string, members []*member) {
	owner := b.name(clusterName)
	if label != "" {
		owner = b.name(label, clusterName)
	}
	e := b.entry(owner)
	srvName := labelSRV + "." + owner
	se := b.entry(srvName)
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
	suffix := "." + finalApex
	var owners []string
	for name := range b.s.names {
		if name == finalApex || strings.HasSuffix(name, suffix) {
			owners = append(owners, name)
		}
	}
	sort.Strings(owners)
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
// with its verdict, and every alias. With the instance's own settings fixed,
// equal hashes mean equal records, so the serial changes only when the
// content does.
func contentHash(clusters []*cluster, aliases []resolvedAlias) uint64 {
	h := fnv.New64a()
	for _, c := range clusters {
		for _, m := range c.members {
			fmt.Fprintf(h, "%s/%s %s %d %s %s %t %s\n", c.name, m.Name, m.Address, m.Port, m.Role, m.addr, m.serving, m.reason)
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

// nodeTXT explains a node's state: in or out, its role, why, and the
// numbers behind the why.
func nodeTXT(m *member, primaries int) []string {
	state := "out"
	if m.serving {
		state = "in"
	}
	detail := m.detail
	if m.serving && m.Role == rolePrimary && primaries > 1 {
		detail = fmt.Sprintf("%d nodes claim to be primary: primary. has no address", primaries)
	}
	txt := []string{
		"state=" + state,
		"role=" + m.Role,
		"address=" + m.Address.Unmap().String(),
		fmt.Sprintf("port=%d", m.Port),
		"reason=" + m.reason,
	}
	if detail != "" {
		txt = append(txt, printable("detail="+detail, maxTXTString))
	}
	return txt
}

// clusterTXT sums a cluster up: nodes in and out, and the nodes that claim to
// be primary. At most maxListed primaries are named, in strings that each
// fit a TXT character-string, so the record packs whatever the registry holds.
func clusterTXT(st clusterStat) []string {
	txt := []string{fmt.Sprintf("serving=%d", st.serving), fmt.Sprintf("out=%d", st.out)}
	names := st.primaries
	more := 0
	if len(names) > maxListed {
		names, more = names[:maxListed], len(names)-maxListed
	}
	cur := "primary="
	for i, n := range names {
		if i > 0 {
			if len(cur)+1+len(n) > maxTXTString {
				txt = append(txt, cur)
				cur = "primary+="
			} else {
				cur += ","
			}
		}
		cur += n
	}
	if more > 0 {
		tail := fmt.Sprintf(",+%d more", more)
		if len(cur)+len(tail) > maxTXTString {
			txt = append(txt, cur)
			cur = "primary+="
			tail = tail[1:]
		}
		cur += tail
	}
	return append(txt, cur)
}

// maxTXTString is the longest character-string a TXT record holds;
// maxListed bounds the primaries a cluster's TXT names.
const (
	maxTXTString = 255
	maxListed    = 8
)

// maxRole bounds the role shown in TXT records: the column is free text.
const maxRole = 63

// printable returns s cut to max bytes, with every byte that is not
// printable ASCII, and the TXT escape characters \ and ", replaced by '?',
// so that a TXT string made from it always packs.
func printable(s string, max int) string {
	b := []byte(s[:min(len(s), max)])
	for i, c := range b {
		if c < 0x20 || c > 0x7e || c == '\\' || c == '"' {
			b[i] = '?'
		}
	}
	return string(b)
}

// isLabel reports whether s is a host name label: letters, digits and inner
// hyphens, at most 63 characters.
func isLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
