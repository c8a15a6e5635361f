package pgcluster

import (
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"github.com/miekg/dns"
)

// nameServer is one name of a zone's NS set, from an ns option, with the
// addresses that name has when it is inside a zone pgcluster serves.
type nameServer struct {
	name  string // fully qualified, in lower case
	addrs []netip.Addr
}

// soaTimers are the SOA's time fields, in seconds. The zero value means no
// soa option: the defaults below, with the negative TTL equal to ttl.
type soaTimers struct {
	refresh, retry, expire uint32
	// negative is the negative TTL: both the SOA's MINIMUM and the TTL of
	// the SOA record itself, since a resolver caches a negative answer for
	// the lesser of the two (RFC 2308, section 5).
	negative uint32
}

// Defaults of the SOA timers. Refresh, retry and expire tell secondaries
// when to transfer the zone again; pgcluster has none (it refuses AXFR and
// IXFR: every instance reads the registry itself), so these are only what
// a delegation check expects of a zone: the values RFC 1912 and Zonemaster
// recommend, refresh at least 4 hours, retry at least 1 hour, expire at
// least a week and above refresh.
const (
	defaultSOARefresh = 4 * 3600
	defaultSOARetry   = 3600
	defaultSOAExpire  = 14 * 24 * 3600
	// maxSOATimer is the largest refresh, retry or expire: RFC 2181 limits
	// a TTL-like value to 2^31 - 1 seconds.
	maxSOATimer = 1<<31 - 1
	// maxNegativeTTL bounds the negative TTL as ttl is bounded. RFC 2308
	// recommends 1 to 3 hours at most.
	maxNegativeTTL = 86400
)

// orDefault returns the SOA timers in force, given the zone's ttl.
func (t soaTimers) orDefault(ttl uint32) soaTimers {
	if t == (soaTimers{}) {
		return soaTimers{refresh: defaultSOARefresh, retry: defaultSOARetry, expire: defaultSOAExpire, negative: ttl}
	}
	return t
}

// nameServers returns zone's NS set: the ns options' names or, without
// any, ns.<zone> with this host's addresses (the single-instance default).
func (s *settings) nameServers(zone string) []nameServer {
	if len(s.ns) > 0 {
		return s.ns
	}
	return []nameServer{{name: under(labelNS, zone), addrs: s.nsAddrs}}
}

// reservedZoneLabel reports whether l, a name just below a zone, holds a
// name server's name, so that no cluster or alias may take it: ns always
// (the single-instance default's ns.<zone>), and the first label below
// the zone of every ns option's name inside a zone.
func (s *settings) reservedZoneLabel(l string) bool {
	return l == labelNS || s.nsLabels[l]
}

// inZone returns the zone of s that name is in, below its apex; "" when
// none.
func (s *settings) inZone(name string) string {
	for _, z := range s.zones {
		if name != z && dns.IsSubDomain(z, name) {
			return z
		}
	}
	return ""
}

// apexEntries makes zone's apex (its NS records and their glue; the SOA is
// set with the serial) and the entries of the name servers' names inside it, as parts
// keyed like the others (see snapshot.find).
func apexEntries(set *settings, zone string) map[string]*part {
	servers := set.nameServers(zone)
	apex := &entry{owner: zone, apex: &apexRecords{ns: make([]dns.RR, 0, len(servers))}}
	names := map[string]map[string]*entry{zone: {"": apex}}
	var glueA, glueAAAA []dns.RR
	for _, ns := range servers {
		apex.apex.ns = append(apex.apex.ns, &dns.NS{Hdr: hdr(zone, dns.TypeNS, set.ttl), Ns: ns.name})
		if set.inZone(ns.name) != zone {
			continue
		}
		key, prefix := splitBelow(ns.name, zone)
		p := names[key]
		if p == nil {
			p = map[string]*entry{}
			names[key] = p
		}
		e := &entry{owner: ns.name}
		for _, a := range ns.addrs {
			e.add(a)
		}
		p[prefix] = e
		for _, a := range ns.addrs {
			if a.Is4() {
				glueA = append(glueA, &dns.A{Hdr: hdr(ns.name, dns.TypeA, set.ttl), A: a.AsSlice()})
			} else {
				glueAAAA = append(glueAAAA, &dns.AAAA{Hdr: hdr(ns.name, dns.TypeAAAA, set.ttl), AAAA: a.AsSlice()})
			}
		}
		for q := parentPrefix(prefix); q != ""; q = parentPrefix(q) {
			if _, ok := p[q]; !ok {
				p[q] = ent
			}
		}
		if _, ok := p[""]; !ok {
			p[""] = ent
		}
	}
	apex.apex.glue = append(glueA, glueAAAA...)
	parts := make(map[string]*part, len(names))
	for key, n := range names {
		parts[key] = newPart(n)
	}
	return parts
}

// splitBelow splits name, inside zone and below its apex, into the name
// just below the zone and the labels before it: "a.b." of
// "a.b.ns1.pgcluster.lan." is under "ns1.pgcluster.lan.".
func splitBelow(name, zone string) (key, prefix string) {
	rest := name // the labels before the zone's, each with its dot
	if zone != "." {
		rest = strings.TrimSuffix(name, zone)
	}
	i := strings.LastIndexByte(rest[:len(rest)-1], '.') + 1
	return under(rest[i:len(rest)-1], zone), rest[:i]
}

// parseApexOption parses "ns NAME [ADDRESS...]" (repeatable: one name
// server each) and "soa REFRESH RETRY EXPIRE NEGATIVE".
func parseApexOption(c *caddy.Controller, cfg *settings, opt string, args []string) error {
	if opt == "soa" {
		return parseSOAOption(c, cfg, args)
	}
	if len(args) < 1 {
		return c.ArgErr()
	}
	if why := badDomain(args[0]); why != "" || args[0] == "." {
		return c.Errf("ns: %q is not a name server's name", args[0])
	}
	ns := nameServer{name: strings.ToLower(dns.Fqdn(args[0]))}
	for _, o := range cfg.ns {
		if o.name == ns.name {
			return c.Errf("ns: %s is given twice; one ns line per name server, with all its addresses", ns.name)
		}
	}
	for _, a := range args[1:] {
		ip, err := netip.ParseAddr(a)
		if err != nil || ip.Zone() != "" || !ip.IsValid() || ip.IsUnspecified() || ip.IsMulticast() {
			return c.Errf("ns %s: %q is not a unicast IPv4 or IPv6 address", args[0], a)
		}
		ns.addrs = append(ns.addrs, ip.Unmap())
	}
	for _, z := range cfg.zones {
		if ns.name == z {
			return c.Errf("ns: %s is the zone's apex; name a server below it (ns1.%s) or outside it", ns.name, z)
		}
	}
	z := cfg.inZone(ns.name)
	switch {
	case z != "" && len(ns.addrs) == 0:
		return c.Errf("ns %s: a name inside the zone needs its addresses (ns %s ADDRESS...): pgcluster answers them, and the parent's glue must match", args[0], args[0])
	case z == "" && len(ns.addrs) > 0:
		return c.Errf("ns %s: the name is outside the zones served here, so its addresses are not answered here; drop them and publish them in the name's own zone", args[0])
	}
	if z != "" {
		key, _ := splitBelow(ns.name, z)
		label := strings.TrimSuffix(key, "."+z)
		if z == "." {
			label = strings.TrimSuffix(key, ".")
		}
		if !isLabel(label) {
			return c.Errf("ns: %q is not a name server's name: %q is not a DNS label", args[0], label)
		}
		if cfg.nsLabels == nil {
			cfg.nsLabels = map[string]bool{}
		}
		cfg.nsLabels[label] = true
	}
	cfg.ns = append(cfg.ns, ns)
	return nil
}

// parseSOAOption parses "soa REFRESH RETRY EXPIRE NEGATIVE", each a number
// of seconds or a duration (4h).
func parseSOAOption(c *caddy.Controller, cfg *settings, args []string) error {
	if len(args) != 4 {
		return c.Errf("soa: want four values, REFRESH RETRY EXPIRE NEGATIVE (for example soa 4h 1h 336h 30s), got %d", len(args))
	}
	var v [4]uint32
	for i, a := range args {
		n, err := soaSeconds(a)
		if err != nil {
			return c.Errf("soa: %q is not a number of seconds or a duration (4h) from 1 s to 2^31-1 s", a)
		}
		v[i] = n
	}
	t := soaTimers{refresh: v[0], retry: v[1], expire: v[2], negative: v[3]}
	switch {
	case t.negative > maxNegativeTTL:
		return c.Errf("soa: negative TTL %d s is above %d (a day); RFC 2308 recommends 1 to 3 hours at most", t.negative, maxNegativeTTL)
	case t.retry >= t.refresh:
		return c.Errf("soa: retry %d s must be shorter than refresh %d s", t.retry, t.refresh)
	case t.expire <= t.refresh+t.retry:
		return c.Errf("soa: expire %d s must be longer than refresh + retry (%d s)", t.expire, t.refresh+t.retry)
	}
	cfg.soa = t
	return nil
}

// soaSeconds reads a SOA timer: whole seconds, or a Go duration of whole
// seconds.
func soaSeconds(s string) (uint32, error) {
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		if n == 0 || n > maxSOATimer {
			return 0, errors.New("out of range")
		}
		return uint32(n), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Second || d > maxSOATimer*time.Second || d%time.Second != 0 {
		return 0, errors.New("not a duration of whole seconds")
	}
	return uint32(d / time.Second), nil
}
