package test

import (
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// largeCluster is a cluster "big" of 2000 nodes: 254 on 192.0.2.0/24, the
// rest on 2001:db8::/32.
const largeCluster = `
INSERT INTO pgcluster_nodes(cluster, name, address, role)
  SELECT 'big', 'node' || i,
         CASE WHEN i <= 254 THEN ('192.0.2.' || i)::inet ELSE ('2001:db8::' || to_hex(i))::inet END,
         'standby'
  FROM generate_series(1, 2000) i;`

// An answer holds what fits the client's buffer, chosen by rotation over every
// serving node: over UDP with TC set when records were left out, over TCP up
// to 64 KB without TC, and SRV answers rotate too.
func TestAnswerLargeCluster(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, largeCluster)
	s := StartCoreDNS(t, Corefile(pg.DSN("")))
	srvName := "_postgresql._tcp.big." + Zone
	tcp := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	Eventually(t, 10*time.Second, func() error {
		r, _, err := tcp.Exchange(question("big."+Zone, dns.TypeAAAA), s.TCP)
		if err != nil {
			return err
		}
		if len(r.Answer) != 2000-254 {
			return fmt.Errorf("%d AAAA records for big, want %d", len(r.Answer), 2000-254)
		}
		return nil
	})

	// TCP: SRV records and their glue up to 64 KB, no TC, a new first target
	// on each query.
	first := map[string]bool{}
	for range 3 {
		r, _, err := tcp.Exchange(question(srvName, dns.TypeSRV), s.TCP)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkSRV(r); err != nil {
			t.Fatalf("SRV over TCP: %v", err)
		}
		if r.Truncated || len(r.Answer) < 500 || len(r.Answer) >= 2000 {
			t.Fatalf("SRV over TCP: TC=%t with %d records; want no TC and as many as fit 64 KB", r.Truncated, len(r.Answer))
		}
		r.Compress = true // as it was sent
		if l := r.Len(); l > dns.MaxMsgSize {
			t.Fatalf("SRV over TCP: %d octets", l)
		}
		first[r.Answer[0].(*dns.SRV).Target] = true
	}
	if len(first) != 3 {
		t.Errorf("SRV over TCP: 3 queries gave %d different first targets, want 3", len(first))
	}

	// UDP: what fits the buffer, TC set.
	udp := &dns.Client{Net: "udp", Timeout: 2 * time.Second, UDPSize: 4096}
	for _, tc := range []struct {
		name  string
		qtype uint16
		size  uint16
		min   int
	}{
		{srvName, dns.TypeSRV, 512, 4},
		{srvName, dns.TypeSRV, 1232, 15},
		{"big." + Zone, dns.TypeA, 512, 25},
		{"big." + Zone, dns.TypeAAAA, 1232, 35},
	} {
		r, err := exchangeEDNS(udp, s.UDP, tc.name, tc.qtype, tc.size)
		if err != nil {
			t.Fatal(err)
		}
		what := fmt.Sprintf("%s %s over UDP, EDNS0 %d", tc.name, dns.TypeToString[tc.qtype], tc.size)
		if r.Rcode != dns.RcodeSuccess || !r.Truncated || len(r.Answer) < tc.min {
			t.Errorf("%s: %s, TC=%t, %d records; want NOERROR, TC and at least %d records", what, dns.RcodeToString[r.Rcode], r.Truncated, len(r.Answer), tc.min)
		}
		if tc.qtype == dns.TypeSRV {
			if err := checkSRV(r); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
		r.Compress = true // as it was sent
		if l := r.Len(); l > int(tc.size) {
			t.Errorf("%s: %d octets", what, l)
		}
	}
}
