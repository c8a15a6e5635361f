package test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// demoRegistry is the seed's cluster: three nodes, prod -> local,
// myapp-db -> prod.
const demoRegistry = `
INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES
  ('local', 'pg1', '192.0.2.11', 5432, 'primary'),
  ('local', 'pg2', '192.0.2.12', 5433, 'standby'),
  ('local', 'pg3', '2001:db8::13', 5432, 'standby');
INSERT INTO pgcluster_nodes(cluster, name, address, role, healthy) VALUES
  ('local', 'pg4', '192.0.2.14', 'standby', false);
INSERT INTO pgcluster_aliases(alias, target) VALUES ('prod', 'local'), ('myapp-db', 'prod');`

// want is what one query must return: the rcode, the answer as
// "type value" strings in order of owner names, and whether the SOA is in
// the authority section.
type want struct {
	name   string
	qtype  uint16
	rcode  int
	answer []string
	soa    bool
	extra  int
}

// TestZoneNames queries every row of the names table over UDP and TCP
// against a real PostgreSQL registry.
func TestZoneNames(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, demoRegistry)
	s := StartCoreDNS(t, Corefile(pg.DSN("")))
	// ns.<zone>'s addresses are this host's (one per family it has): the
	// NS answer carries them as glue.
	glue := 0
	for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA} {
		glue += len(MustQuery(t, "udp", s.UDP, "ns."+Zone, qt).Answer)
	}

	cases := []want{
		{name: "", qtype: dns.TypeSOA, answer: []string{"pgcluster.lan. SOA ns.pgcluster.lan."}},
		{name: "", qtype: dns.TypeNS, extra: glue, answer: []string{"pgcluster.lan. NS ns.pgcluster.lan."}},
		{name: "local", qtype: dns.TypeA, answer: []string{"local.pgcluster.lan. A 192.0.2.11", "local.pgcluster.lan. A 192.0.2.12"}},
		{name: "local", qtype: dns.TypeAAAA, answer: []string{"local.pgcluster.lan. AAAA 2001:db8::13"}},
		{name: "primary.local", qtype: dns.TypeA, answer: []string{"primary.local.pgcluster.lan. A 192.0.2.11"}},
		{name: "primary.local", qtype: dns.TypeAAAA, soa: true},
		{name: "standby.local", qtype: dns.TypeA, answer: []string{"standby.local.pgcluster.lan. A 192.0.2.12"}},
		{name: "replica.local", qtype: dns.TypeA, answer: []string{"replica.local.pgcluster.lan. A 192.0.2.12"}},
		{name: "prefer-standby.local", qtype: dns.TypeA, answer: []string{"prefer-standby.local.pgcluster.lan. A 192.0.2.12"}},
		{name: "pg2.local", qtype: dns.TypeA, answer: []string{"pg2.local.pgcluster.lan. A 192.0.2.12"}},
		{name: "pg4.local", qtype: dns.TypeA, soa: true},
		{name: "pg4.local", qtype: dns.TypeTXT, answer: []string{`pg4.local.pgcluster.lan. TXT "state=out" "role=standby" "address=192.0.2.14" "port=5432" "reason=unhealthy" "detail=the registry marks it unhealthy"`}},
		{name: "_postgresql._tcp.local", qtype: dns.TypeSRV, extra: 3, answer: []string{
			"_postgresql._tcp.local.pgcluster.lan. SRV 0 10 5432 pg1.local.pgcluster.lan.",
			"_postgresql._tcp.local.pgcluster.lan. SRV 0 10 5433 pg2.local.pgcluster.lan.",
			"_postgresql._tcp.local.pgcluster.lan. SRV 0 10 5432 pg3.local.pgcluster.lan.",
		}},
		{name: "prod", qtype: dns.TypeA, answer: []string{
			"prod.pgcluster.lan. CNAME local.pgcluster.lan.",
			"local.pgcluster.lan. A 192.0.2.11", "local.pgcluster.lan. A 192.0.2.12",
		}},
		{name: "myapp-db", qtype: dns.TypeA, answer: []string{
			"myapp-db.pgcluster.lan. CNAME prod.pgcluster.lan.",
			"prod.pgcluster.lan. CNAME local.pgcluster.lan.",
			"local.pgcluster.lan. A 192.0.2.11", "local.pgcluster.lan. A 192.0.2.12",
		}},
		{name: "primary.prod", qtype: dns.TypeA, answer: []string{
			"primary.prod.pgcluster.lan. CNAME primary.local.pgcluster.lan.",
			"primary.local.pgcluster.lan. A 192.0.2.11",
		}},
		{name: "standby.myapp-db", qtype: dns.TypeA, answer: []string{
			"standby.myapp-db.pgcluster.lan. CNAME standby.prod.pgcluster.lan.",
			"standby.prod.pgcluster.lan. CNAME standby.local.pgcluster.lan.",
			"standby.local.pgcluster.lan. A 192.0.2.12",
		}},
		{name: "_postgresql._tcp.prod", qtype: dns.TypeSRV, extra: 3, answer: []string{
			"_postgresql._tcp.prod.pgcluster.lan. CNAME _postgresql._tcp.local.pgcluster.lan.",
			"_postgresql._tcp.local.pgcluster.lan. SRV 0 10 5432 pg1.local.pgcluster.lan.",
			"_postgresql._tcp.local.pgcluster.lan. SRV 0 10 5433 pg2.local.pgcluster.lan.",
			"_postgresql._tcp.local.pgcluster.lan. SRV 0 10 5432 pg3.local.pgcluster.lan.",
		}},
		{name: "nosuch", qtype: dns.TypeA, rcode: dns.RcodeNameError, soa: true},
		{name: "nosuch.local", qtype: dns.TypeA, rcode: dns.RcodeNameError, soa: true},
		{name: "nosuch.prod", qtype: dns.TypeA, rcode: dns.RcodeNameError, soa: true},
		{name: "local", qtype: dns.TypeMX, soa: true},
		{name: "local", qtype: dns.TypeANY, answer: []string{`local.pgcluster.lan. HINFO "RFC8482" ""`}},
	}
	for _, proto := range []string{"udp", "tcp"} {
		addr := s.UDP
		if proto == "tcp" {
			addr = s.TCP
		}
		for _, c := range cases {
			qname := strings.TrimPrefix(c.name+"."+Zone, ".")
			r := MustQuery(t, proto, addr, qname, c.qtype)
			label := fmt.Sprintf("%s %s %s", proto, qname, dns.TypeToString[c.qtype])
			if err := check(r, c); err != nil {
				t.Errorf("%s: %v\n%s", label, err, r)
			}
		}
	}
}

func check(r *dns.Msg, c want) error {
	if !r.Authoritative {
		return fmt.Errorf("aa not set")
	}
	if r.Rcode != c.rcode {
		return fmt.Errorf("rcode %s, want %s", dns.RcodeToString[r.Rcode], dns.RcodeToString[c.rcode])
	}
	got := make([]string, len(r.Answer))
	for i, rr := range r.Answer {
		got[i] = brief(rr)
	}
	if err := sameAnswer(got, c.answer); err != nil {
		return err
	}
	hasSOA := len(r.Ns) == 1 && r.Ns[0].Header().Rrtype == dns.TypeSOA
	if hasSOA != c.soa {
		return fmt.Errorf("SOA in authority: %v, want %v", hasSOA, c.soa)
	}
	if len(r.Extra) != c.extra {
		return fmt.Errorf("%d additional records, want %d", len(r.Extra), c.extra)
	}
	return nil
}

// sameAnswer compares answers: CNAMEs in order first, then the rest as a set
// (address order rotates from query to query).
func sameAnswer(got, want []string) error {
	if len(got) != len(want) {
		return fmt.Errorf("answer %q, want %q", got, want)
	}
	seen := map[string]int{}
	for i, g := range got {
		if strings.Contains(want[i], " CNAME ") || strings.Contains(g, " CNAME ") {
			if g != want[i] {
				return fmt.Errorf("answer %q, want %q", got, want)
			}
			continue
		}
		seen[g]++
		seen[want[i]]--
	}
	for _, n := range seen {
		if n != 0 {
			return fmt.Errorf("answer %q, want %q", got, want)
		}
	}
	return nil
}

// brief is "owner TYPE rdata" without TTL and class.
func brief(rr dns.RR) string {
	h := rr.Header()
	rdata := strings.TrimPrefix(rr.String(), h.String())
	if soa, ok := rr.(*dns.SOA); ok {
		rdata = soa.Ns
	}
	return h.Name + " " + dns.TypeToString[h.Rrtype] + " " + rdata
}
