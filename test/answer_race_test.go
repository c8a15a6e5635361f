package test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// bigRegistry inserts a cluster c30 of 30 nodes on 192.0.2.0/24 and a
// cluster c200 of 200 nodes on 198.51.100.0/24.
const bigRegistry = `
INSERT INTO pgcluster_nodes(cluster, name, address, role)
  SELECT 'c30', 'node' || i, ('192.0.2.' || i)::inet, 'standby' FROM generate_series(1, 30) i;
INSERT INTO pgcluster_nodes(cluster, name, address, role)
  SELECT 'c200', 'node' || i, ('198.51.100.' || i)::inet, 'standby' FROM generate_series(1, 200) i;`

// exchangeEDNS sends one query over net to addr, with an EDNS0 buffer of
// size octets.
func exchangeEDNS(c *dns.Client, addr, name string, qtype, size uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.SetEdns0(size, false)
	r, _, err := c.Exchange(m, addr)
	return r, err
}

// checkSRV checks an SRV answer: every target once, each with exactly one
// address record in the additional section, and an OPT record only at the end.
func checkSRV(m *dns.Msg) error {
	targets := map[string]int{}
	for _, rr := range m.Answer {
		srv, ok := rr.(*dns.SRV)
		if !ok {
			return fmt.Errorf("not an SRV record in the answer: %v", rr)
		}
		if targets[srv.Target]++; targets[srv.Target] > 1 {
			return fmt.Errorf("SRV target %s twice", srv.Target)
		}
	}
	glue := map[string]int{}
	for i, rr := range m.Extra {
		switch rr.(type) {
		case *dns.OPT:
			if i != len(m.Extra)-1 {
				return fmt.Errorf("OPT record at %d of %d additional records", i, len(m.Extra))
			}
		case *dns.A, *dns.AAAA:
			name := rr.Header().Name
			if targets[name] == 0 {
				return fmt.Errorf("glue for %s, which is no SRV target", name)
			}
			if glue[name]++; glue[name] > 1 {
				return fmt.Errorf("glue for %s twice", name)
			}
		default:
			return fmt.Errorf("unexpected additional record %v", rr)
		}
	}
	if len(glue) != len(targets) {
		return fmt.Errorf("%d glue records for %d SRV targets", len(glue), len(targets))
	}
	return nil
}

// Nothing reachable from the snapshot is handed to CoreDNS's writers: EDNS0
// SRV queries whose answer CoreDNS's writer truncates, many at once over UDP
// and TCP, through the real server and its writer chain. Before the fix, the
// writers wrote into the live snapshot: -race reports it, the TCP answer then
// has duplicate glue with OPT in the middle, and the process crashes under
// load.
func TestAnswerConcurrentTruncation(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, bigRegistry)
	s := StartCoreDNS(t, Corefile(pg.DSN("")))
	tcp := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	Eventually(t, 10*time.Second, func() error {
		r, _, err := tcp.Exchange(question("_postgresql._tcp.c200."+Zone, dns.TypeSRV), s.TCP)
		if err != nil {
			return err
		}
		if len(r.Answer) != 200 {
			return fmt.Errorf("%d SRV records for c200, want 200", len(r.Answer))
		}
		return nil
	})

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Go(func() {
			udp := &dns.Client{Net: "udp", Timeout: 2 * time.Second, UDPSize: 4096}
			for i := range 150 {
				c, addr := udp, s.UDP
				if i%5 == 0 {
					c, addr = tcp, s.TCP
				}
				name := "_postgresql._tcp.c30." + Zone
				if (g+i)%2 == 0 {
					name = "_postgresql._tcp.c200." + Zone
				}
				size := []uint16{512, 1232, 1400}[(g+i)%3]
				r, err := exchangeEDNS(c, addr, name, dns.TypeSRV, size)
				if err == nil {
					err = checkSRV(r)
				}
				if err != nil {
					errs <- fmt.Errorf("query %d of client %d (%s, EDNS0 %d, %s): %w", i, g, name, size, c.Net, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// The zone is still right: every target once, each with its glue.
	for name, n := range map[string]int{"c30": 30, "c200": 200} {
		r := MustQuery(t, "tcp", s.TCP, "_postgresql._tcp."+name+"."+Zone, dns.TypeSRV)
		if err := checkSRV(r); err != nil {
			t.Errorf("%s over TCP after the load: %v", name, err)
		}
		if len(r.Answer) != n || len(r.Extra) != n {
			t.Errorf("%s over TCP after the load: %d SRV and %d additional records, want %d of each", name, len(r.Answer), len(r.Extra), n)
		}
	}
}

func question(name string, qtype uint16) *dns.Msg {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	return m
}
