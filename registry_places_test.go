package pgcluster

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// beforePlaces makes the registry as a schema.sql made it before nodes had
// a place and client networks existed.
const beforePlaces = `DROP TABLE pgcluster_networks;
DROP FUNCTION pgcluster_notify_networks();
ALTER TABLE pgcluster_nodes DROP COLUMN region, DROP COLUMN zone;`

// A follower of a registry made before places serves its nodes without a
// place; schema.sql (run twice) upgrades the registry in place, its rows
// kept with no place; then the follower sees every change of a node's
// region or zone and of the networks through notifications alone (refresh
// is an hour).
func TestFollowPlaces(t *testing.T) {
	pg := pgtest.New(t)
	pg.MustExec(t, Schema)
	pg.MustExec(t, beforePlaces)
	pg.MustExec(t, "INSERT INTO pgcluster_nodes(cluster, name, address) VALUES ('c', 'n1', '192.0.2.1')")
	f := follow(t, pg, &settings{refresh: time.Hour})
	if nodes, _, _ := f.state(); len(nodes) != 1 {
		t.Fatalf("old registry: %+v", nodes)
	}
	for range 2 {
		pg.MustExec(t, Schema)
	}
	waitFollower := func(what string, ok func(nodes []Node, networks []Network) bool) {
		t.Helper()
		if err := pgtest.WaitFor(10*time.Second, func() error {
			f.mu.Lock()
			nets := f.networks
			f.mu.Unlock()
			nodes, _, _ := f.state()
			if !ok(nodes, nets) {
				return fmt.Errorf("nodes %+v networks %v", nodes, nets)
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	waitFollower("upgraded", func(ns []Node, _ []Network) bool {
		return len(ns) == 1 && ns[0].Region == "" && ns[0].Zone == ""
	})
	pg.MustExec(t, "UPDATE pgcluster_nodes SET region = 'eu', zone = 'eu-a' WHERE name = 'n1'")
	waitFollower("place set", func(ns []Node, _ []Network) bool {
		return len(ns) == 1 && ns[0].Region == "eu" && ns[0].Zone == "eu-a"
	})
	pg.MustExec(t, "UPDATE pgcluster_nodes SET zone = 'eu-b'")
	waitFollower("zone alone", func(ns []Node, _ []Network) bool { return len(ns) == 1 && ns[0].Zone == "eu-b" })

	netTexts := func(nets []Network) []string {
		var out []string
		for _, n := range nets {
			out = append(out, n.Network.String()+" "+n.Region+"/"+n.Zone)
		}
		slices.Sort(out)
		return out
	}
	want := func(texts ...string) func([]Node, []Network) bool {
		return func(_ []Node, nets []Network) bool { return slices.Equal(netTexts(nets), texts) }
	}
	pg.MustExec(t, "INSERT INTO pgcluster_networks VALUES ('10.0.0.0/16', 'eu', 'eu-a'), ('10.0.5.0/24', NULL, 'eu-b')")
	waitFollower("networks inserted", want("10.0.0.0/16 eu/eu-a", "10.0.5.0/24 /eu-b"))
	pg.MustExec(t, "UPDATE pgcluster_networks SET zone = 'eu-c' WHERE network = '10.0.5.0/24'")
	waitFollower("network updated", want("10.0.0.0/16 eu/eu-a", "10.0.5.0/24 /eu-c"))
	pg.MustExec(t, "DELETE FROM pgcluster_networks WHERE network = '10.0.0.0/16'")
	waitFollower("network deleted", want("10.0.5.0/24 /eu-c"))
	pg.MustExec(t, "TRUNCATE pgcluster_networks")
	waitFollower("networks truncated", want())
}

// Nodes' places and the networks reach a reader through the registry copy
// in Redis: the instance that does not follow PostgreSQL places a client
// of each zone's network as the follower does.
func TestRelayCarriesPlaces(t *testing.T) {
	g := newRelayRig(t)
	g.pg.MustExec(t, `UPDATE pgcluster_nodes SET region = 'eu', zone = CASE name WHEN 'pg1' THEN 'a' ELSE 'b' END;
INSERT INTO pgcluster_networks VALUES ('10.1.0.0/16', 'eu', 'a'), ('10.2.0.0/16', 'eu', 'b')`)
	for i := range 2 {
		set := g.settings(g.pg.DSN(""), relayAttackSecret)
		set.topology, set.minLocal = topologyLocal, 1
		in := g.start(fmt.Sprintf("instance %d", i+1), set)
		in.p.topology, in.p.minLocal, in.p.topo = topologyLocal, 1, newTopologyCounters(set)
		g.add(in)
	}
	g.wait(10*time.Second, "one follower", func() error { return g.oneFollower() })
	g.wait(10*time.Second, "every instance places zone a's and zone b's clients", func() error {
		for _, in := range g.fleetNow() {
			if in.p.snapshot() == nil {
				return fmt.Errorf("%s: nothing served yet", in.name)
			}
			for subnet, want := range map[string]string{"10.1.3.0/24": "192.0.2.1", "10.2.3.0/24": "192.0.2.2 192.0.2.3"} {
				m := askFrom(t, in.p, "local."+testZone, dns.TypeA, subnet, "")
				got := answerAddrs(m)
				slices.Sort(got)
				if strings.Join(got, " ") != want || replyScope(m) != 16 {
					return fmt.Errorf("%s (%s): %s answered %v scope %d, want %s", in.name, in.r.role, subnet, got, replyScope(m), want)
				}
			}
		}
		return nil
	})
	roles := map[string]bool{}
	for _, in := range g.fleetNow() {
		roles[in.r.role] = true
	}
	if !roles[roleReader] || !roles[roleFollower] {
		t.Fatalf("roles %v: want a follower and a reader", roles)
	}
	// A change of the networks reaches the reader too.
	g.pg.MustExec(t, "UPDATE pgcluster_networks SET zone = 'a' WHERE network = '10.2.0.0/16'")
	g.wait(10*time.Second, "the moved network", func() error {
		for _, in := range g.fleetNow() {
			if got := answerAddrs(askFrom(t, in.p, "local."+testZone, dns.TypeA, "10.2.3.0/24", "")); strings.Join(got, " ") != "192.0.2.1" {
				return fmt.Errorf("%s (%s): %v", in.name, in.r.role, got)
			}
		}
		return nil
	})
}
