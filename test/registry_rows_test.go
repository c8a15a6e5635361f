package test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/proc"
)

// TestRegistryInfiniteHeartbeat serves from a registry made by an older
// schema.sql that holds rows no longer accepted: heartbeats 'infinity' and
// '-infinity', an address '10.1.0.0/16'. Applying schema.sql again succeeds;
// a fresh instance loads the other rows, is ready, and follows later changes;
// the odd rows are out.
func TestRegistryInfiniteHeartbeat(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, `ALTER TABLE pgcluster_nodes DROP CONSTRAINT IF EXISTS pgcluster_nodes_heartbeat_finite;
ALTER TABLE pgcluster_nodes DROP CONSTRAINT IF EXISTS pgcluster_nodes_address_host;`)
	pg.MustExec(t, demoRegistry+`
INSERT INTO pgcluster_nodes(cluster, name, address, heartbeat) VALUES
  ('local', 'future', '192.0.2.21', 'infinity'),
  ('local', 'past', '192.0.2.22', '-infinity'),
  ('local', 'ancient', '192.0.2.23', '1700-01-01');
INSERT INTO pgcluster_nodes(cluster, name, address) VALUES ('local', 'net', '10.1.0.0/16');`)
	pg.MustExec(t, pgcluster.Schema) // the upgrade: must not fail on the rows already there

	readyPort, _ := proc.FreePort()
	metricsPort, _ := proc.FreePort()
	corefile := fmt.Sprintf("%s:0 {\n bind 127.0.0.1\n ready 127.0.0.1:%d\n prometheus 127.0.0.1:%d\n pgcluster {\n  postgres %s\n  stale_after 10s\n }\n}\n",
		Zone, readyPort, metricsPort, pg.DSN(""))
	s := StartCoreDNS(t, corefile)

	if _, err := get(fmt.Sprintf("http://127.0.0.1:%d/ready", readyPort)); err != nil {
		t.Fatalf("not ready: %v", err)
	}
	body, err := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	if err != nil {
		t.Fatal(err)
	}
	if want := `coredns_pgcluster_registry_up{zone="pgcluster.lan."} 1`; !strings.Contains(body, want) {
		t.Errorf("metrics lack %s", want)
	}
	r := MustQuery(t, "udp", s.UDP, "local."+Zone, dns.TypeA)
	if got := Addrs(r); r.Rcode != dns.RcodeSuccess || strings.Join(got, " ") != "192.0.2.11 192.0.2.12" {
		t.Errorf("local: rcode %s, %v; want the two fresh nodes only", dns.RcodeToString[r.Rcode], got)
	}
	for _, name := range []string{"future", "past", "ancient", "net"} {
		txt := MustQuery(t, "udp", s.UDP, name+".local."+Zone, dns.TypeTXT)
		if len(txt.Answer) == 0 || !strings.Contains(txt.Answer[0].String(), "state=out") {
			t.Errorf("%s: TXT %v, want state=out", name, txt.Answer)
		}
	}

	// Later changes are served.
	pg.MustExec(t, "UPDATE pgcluster_nodes SET address = '192.0.2.41' WHERE name = 'pg1'")
	Eventually(t, 5*time.Second, func() error { return hasAddr(s, "pg1.local."+Zone, "192.0.2.41") })

	// New rows like the odd ones are refused.
	for _, bad := range []string{
		"INSERT INTO pgcluster_nodes(cluster, name, address, heartbeat) VALUES ('local', 'x', '192.0.2.30', 'infinity')",
		"INSERT INTO pgcluster_nodes(cluster, name, address) VALUES ('local', 'x', '10.2.0.0/16')",
	} {
		if err := pg.Exec(Ctx(t), bad); err == nil || !strings.Contains(err.Error(), "23514") {
			t.Errorf("%s: %v, want a check violation", bad, err)
		}
	}
}
