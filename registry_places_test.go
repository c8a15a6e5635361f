package pgcluster

import (
	"fmt"
	"slices"
	"testing"
	"time"

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
