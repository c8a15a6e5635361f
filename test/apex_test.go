package test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

// apexOptions are the ns and soa lines of a fleet's Corefile: two name
// servers inside the zone, one outside it.
var apexOptions = []string{
	"ns ns1." + Zone + " 192.0.2.53 2001:db8::53",
	"ns ns2." + Zone + " 198.51.100.53",
	"ns dns.example.net.",
	"soa 4h 1h 336h 30",
}

// TestApexSameOnEveryInstance: two instances started with the same Corefile
// give the same answers for the apex and every ns name, so that a resolver
// asking any of them sees one zone: the NS set, the name servers' addresses
// and the SOA come from the Corefile, not from the host. The SOA serial is
// each instance's own (the time it loaded the registry) unless the registry
// relay gives the fleet's version, so it is left out of the comparison.
func TestApexSameOnEveryInstance(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, `INSERT INTO pgcluster_nodes(cluster, name, address, role) VALUES ('local', 'pg1', '192.0.2.1', 'primary')`)
	corefile := strings.Replace(pgclusterCorefile(pg.DSN(""), apexOptions...), " soa 4h 1h 14d 30", " soa 4h 1h 336h 30", 1)
	corefile = strings.Replace(corefile, "soa 4h 1h 336h 30", "soa 4h 1h 336h 30", 1)
	a, b := StartFleetInstance(t, corefile), StartFleetInstance(t, corefile)

	names := []string{Zone, "ns1." + Zone, "ns2." + Zone, "ns." + Zone, "dns.example.net."}
	types := []uint16{dns.TypeSOA, dns.TypeNS, dns.TypeA, dns.TypeAAAA, dns.TypeTXT}
	for _, name := range names {
		for _, qt := range types {
			ra, rb := apexAnswer(t, a.Addr(), name, qt), apexAnswer(t, b.Addr(), name, qt)
			if ra != rb {
				t.Errorf("%s %s differs between the two instances:\n%s\n---\n%s", name, dns.TypeToString[qt], ra, rb)
			}
		}
	}
	want := map[string]string{
		// The NS set, and in the additional section the addresses of the
		// name servers inside the zone (glue; dns.example.net. is not ours).
		Zone + " NS": "NOERROR aa\n" + Zone + " 5 IN NS ns1." + Zone + "\n" + Zone + " 5 IN NS ns2." + Zone + "\n" + Zone + " 5 IN NS dns.example.net.\n" +
			"ns1." + Zone + " 5 IN A 192.0.2.53\n" + "ns2." + Zone + " 5 IN A 198.51.100.53\n" + "ns1." + Zone + " 5 IN AAAA 2001:db8::53\n",
		"ns1." + Zone + " A": "NOERROR aa\nns1." + Zone + " 5 IN A 192.0.2.53\n",
		"ns2." + Zone + " A": "NOERROR aa\nns2." + Zone + " 5 IN A 198.51.100.53\n",
		Zone + " SOA":        "NOERROR aa\n" + Zone + " 30 IN SOA ns1." + Zone + " hostmaster." + Zone + " (serial) 14400 3600 1209600 30\n",
	}
	for q, w := range want {
		name, qt, _ := strings.Cut(q, " ")
		if got := apexAnswer(t, a.Addr(), name, dns.StringToType[qt]); got != w {
			t.Errorf("%s:\n%s\nwant\n%s", q, got, w)
		}
	}
}

// apexAnswer asks addr over UDP and renders the reply: rcode, aa, every
// record of every section, tabs as spaces, the SOA serial replaced by
// "(serial)".
func apexAnswer(t *testing.T, addr, name string, qtype uint16) string {
	t.Helper()
	r := MustQuery(t, "udp", addr, name, qtype)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s", dns.RcodeToString[r.Rcode])
	if r.Authoritative {
		sb.WriteString(" aa")
	}
	sb.WriteString("\n")
	for _, sec := range [][]dns.RR{r.Answer, r.Ns, r.Extra} {
		for _, rr := range sec {
			if _, ok := rr.(*dns.OPT); ok {
				continue
			}
			s := strings.Join(strings.Fields(rr.String()), " ")
			if _, ok := rr.(*dns.SOA); ok {
				f := strings.Fields(s)
				f[6] = "(serial)"
				s = strings.Join(f, " ")
			}
			sb.WriteString(s + "\n")
		}
	}
	return sb.String()
}
