package discoverytest

import (
	"sort"

	"github.com/miekg/dns"
)

// fit trims m to at most size bytes when it is bigger: it keeps the CNAMEs,
// and of the records at the end of the chain as many as fit, starting at
// turn modulo their number, each with its glue. It reports whether it left
// records out.
func fit(m *dns.Msg, size int, turn uint32) bool {
	m.Compress = true
	if m.Len() <= size {
		return false
	}
	var chain, set []dns.RR
	for _, rr := range m.Answer {
		if _, ok := rr.(*dns.CNAME); ok {
			chain = append(chain, rr)
		} else {
			set = append(set, rr)
		}
	}
	glue := make(map[string][]dns.RR)
	for _, rr := range m.Extra {
		name := dns.CanonicalName(rr.Header().Name)
		glue[name] = append(glue[name], rr)
	}
	rotated := make([]dns.RR, 0, len(set))
	if len(set) > 0 {
		k := int(turn % uint32(len(set)))
		rotated = append(append(rotated, set[k:]...), set[:k]...)
	}
	keep := func(n int) {
		m.Answer = append(chain[:len(chain):len(chain)], rotated[:n]...)
		m.Extra = nil
		for _, rr := range rotated[:n] {
			if srv, ok := rr.(*dns.SRV); ok {
				m.Extra = append(m.Extra, glue[dns.CanonicalName(srv.Target)]...)
			}
		}
	}
	n := sort.Search(len(rotated)+1, func(n int) bool {
		keep(n)
		return m.Len() > size
	})
	keep(max(n-1, 0))
	return true
}
