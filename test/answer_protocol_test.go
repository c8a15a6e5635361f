package test

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// The zone is no secondary, so NOTIFY is not implemented, and it has no
// transfer plugin, so AXFR and IXFR are refused, as CoreDNS's file plugin
// refuses them.
func TestAnswerNotifyAndTransfer(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, demoRegistry)
	s := StartCoreDNS(t, Corefile(pg.DSN("")))
	Eventually(t, 10*time.Second, func() error {
		_, err := Exchange("tcp", s.TCP, "local."+Zone, dns.TypeA)
		return err
	})

	notify := new(dns.Msg)
	notify.SetNotify(Zone)
	axfr := new(dns.Msg)
	axfr.SetAxfr(Zone)
	ixfr := new(dns.Msg)
	ixfr.SetIxfr(Zone, 1, "ns."+Zone, "hostmaster."+Zone)
	for _, tc := range []struct {
		what, net, addr string
		m               *dns.Msg
		rcode           int
	}{
		{"NOTIFY over UDP", "udp", s.UDP, notify, dns.RcodeNotImplemented},
		{"NOTIFY over TCP", "tcp", s.TCP, notify, dns.RcodeNotImplemented},
		{"AXFR", "tcp", s.TCP, axfr, dns.RcodeRefused},
		{"IXFR over TCP", "tcp", s.TCP, ixfr, dns.RcodeRefused},
		{"IXFR over UDP", "udp", s.UDP, ixfr, dns.RcodeRefused},
	} {
		c := &dns.Client{Net: tc.net, Timeout: 2 * time.Second}
		r, _, err := c.Exchange(tc.m, tc.addr)
		if err != nil {
			t.Errorf("%s: %v", tc.what, err)
			continue
		}
		if r.Rcode != tc.rcode || len(r.Answer) != 0 {
			t.Errorf("%s: %s with %d records, want %s and none", tc.what, dns.RcodeToString[r.Rcode], len(r.Answer), dns.RcodeToString[tc.rcode])
		}
	}
}
