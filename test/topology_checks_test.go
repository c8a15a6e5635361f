package test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/coretest"
)

// TestTopologyChecksStopped: topology local with check tcp over real
// listeners, three nodes in zone a and three in zone b. Zone a's listeners
// all closed, zone a's clients get zone b's nodes within the checks'
// bound (fall × interval + timeout); opened again, zone a's own come back
// within rise × interval.
func TestTopologyChecksStopped(t *testing.T) {
	const interval, timeout, fall, rise = 500 * time.Millisecond, 300 * time.Millisecond, 2, 2
	type node struct{ name, zone, addr string }
	nodes := []node{{"a1", "a", "127.0.0.111"}, {"a2", "a", "127.0.0.112"}, {"a3", "a", "127.0.0.113"},
		{"b1", "b", "127.0.0.114"}, {"b2", "b", "127.0.0.115"}, {"b3", "b", "127.0.0.116"}}
	listeners := map[string]*coretest.Backend{}
	var rows []string
	byZone := map[string][]string{}
	for _, n := range nodes {
		b := coretest.NewBackend(t, n.addr)
		listeners[n.name] = b
		rows = append(rows, fmt.Sprintf("('main', '%s', '%s', %d, 'standby', 'eu', '%s')", n.name, n.addr, b.Port, n.zone))
		byZone[n.zone] = append(byZone[n.zone], n.addr)
	}
	pg := Registry(t)
	pg.MustExec(t, "INSERT INTO pgcluster_nodes(cluster, name, address, port, role, region, zone) VALUES "+strings.Join(rows, ", ")+
		";\nINSERT INTO pgcluster_networks(network, region, zone) VALUES ('10.1.0.0/16', 'eu', 'a'), ('10.2.0.0/16', 'eu', 'b')")
	in := StartFleetInstance(t, fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n pgcluster {\n  postgres %s\n  allow_loopback\n  topology local\n  check tcp\n  interval %v\n  timeout %v\n  fall %d\n  rise %d\n }\n}\n",
		Zone, PortPlaceholder, pg.DSN(""), interval, timeout, fall, rise))
	zoneA := func(want []string) func() error {
		return func() error {
			r, err := ecsQuery(in.Addr(), "main."+Zone, dns.TypeA, "10.1.7.0/24", "")
			if err != nil {
				return err
			}
			return placedAs(inOrder(r), want, nil)
		}
	}
	Eventually(t, 10*time.Second, zoneA(byZone["a"]))
	stopped := time.Now()
	for _, n := range []string{"a1", "a2", "a3"} {
		listeners[n].Close()
	}
	Eventually(t, 10*time.Second, zoneA(byZone["b"]))
	took := time.Since(stopped)
	bound := fall*interval + timeout + interval
	t.Logf("zone a's nodes stopped: zone a's clients get zone b's after %v (bound fall × interval + timeout + an interval's phase: %v)", took.Round(time.Millisecond), bound)
	if took > 2*bound {
		t.Errorf("zone a's clients got zone b's nodes %v after zone a's stopped, over twice the bound %v", took, bound)
	}
	started := time.Now()
	for _, n := range []string{"a1", "a2", "a3"} {
		listeners[n].Open(t)
	}
	Eventually(t, 10*time.Second, zoneA(byZone["a"]))
	t.Logf("zone a's nodes back: zone a's clients get them again after %v", time.Since(started).Round(time.Millisecond))
}
