package test

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

func TestSmoke(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, `INSERT INTO pgcluster_nodes(name, address, role) VALUES ('a','127.0.0.11','primary'),('b','127.0.0.12','standby'),('c','127.0.0.13','standby');
INSERT INTO pgcluster_aliases VALUES ('prod','local'),('myapp-db','prod')`)
	s := StartCoreDNS(t, Corefile(pg.DSN(""), "allow_loopback"))
	r := MustQuery(t, "udp", s.UDP, "myapp-db."+Zone, dns.TypeA)
	t.Log(r)
	pg.MustExec(t, `DELETE FROM pgcluster_nodes WHERE name='c'`)
	start := time.Now()
	Eventually(t, 5*time.Second, func() error {
		r := MustQuery(t, "udp", s.UDP, "local."+Zone, dns.TypeA)
		if len(r.Answer) != 2 {
			return errorf("%d answers", len(r.Answer))
		}
		return nil
	})
	t.Log(time.Since(start))
}
