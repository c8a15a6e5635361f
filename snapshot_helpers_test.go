package pgcluster

import (
	"maps"
	"slices"
	"time"

	"github.com/miekg/dns"
)

// owner is a name the snapshot answers: the entry its answer comes from
// and, for a name under an alias, the alias.
type owner struct {
	e     *entry
	alias *aliasPart
}

// owners returns every name the snapshot answers.
func owners(s *snapshot) map[string]owner {
	out := map[string]owner{}
	for key, p := range s.parts {
		if p.alias != nil {
			for prefix, e := range s.parts[p.alias.final].names {
				out[prefix+key] = owner{e: e, alias: p.alias}
			}
			continue
		}
		for prefix, e := range p.names {
			out[prefix+key] = owner{e: e}
		}
	}
	return out
}

// entryOf returns the entry name's answer comes from (for a name under an
// alias, the final cluster's), or nil.
func entryOf(s *snapshot, name string) *entry {
	for _, z := range s.set.zones {
		if dns.IsSubDomain(z, name) {
			e, _, _ := s.lookup(name, z)
			return e
		}
	}
	return nil
}

// allSkipped lists every row the snapshot does not serve: the clusters'
// in order, then the aliases'.
func allSkipped(s *snapshot) []skipped {
	var out []skipped
	for _, name := range slices.Sorted(maps.Keys(s.clusters)) {
		out = append(out, s.clusters[name].skipped...)
	}
	return append(out, s.aliases.skipped...)
}

// apply publishes a full read of nodes and aliases, made now.
func (pb *publisher) apply(nodes []Node, aliases []Alias) {
	pb.applyAt(rowsUpdate{nodes: groupNodes(nodes), full: true, aliases: aliases, aliasesSet: true, loadedAt: time.Now()})
}

// records returns e's A and AAAA records, its SRV records and their glue,
// as an answer with room for all of them holds them (from the first one).
func records(e *entry) (a, aaaa, srv, extra []dns.RR) {
	p := &PgCluster{ttl: 5}
	p.rotate.Store(^uint32(0)) // the next rotation starts at 0
	m := new(dns.Msg)
	b := &budget{size: 1 << 30}
	p.addresses(m, b, e, dns.TypeA)
	a, m.Answer = m.Answer, nil
	p.rotate.Store(^uint32(0))
	p.addresses(m, b, e, dns.TypeAAAA)
	aaaa, m.Answer = m.Answer, nil
	p.rotate.Store(^uint32(0))
	p.services(m, b, e)
	return a, aaaa, m.Answer, m.Extra
}
