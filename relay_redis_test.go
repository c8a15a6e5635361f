package pgcluster

import (
	"encoding/json"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"
)

// The copy's fields hold every column of the rows, the heartbeat's age and
// time included (or its absence), and the aliases; what the fields make is
// what the follower applied.
func TestRelayFieldsRoundTrip(t *testing.T) {
	beat := time.Date(2026, 1, 2, 3, 4, 5, 678000, time.UTC)
	rows := &rowSet{}
	rows.merge(rowsUpdate{full: true, nodes: map[string][]Node{
		"local": {
			{Cluster: "local", Name: "pg1", Address: netip.MustParseAddr("10.0.0.1"), Port: 5432, Role: "primary", Healthy: true, HeartbeatAge: 1500 * time.Millisecond, Heartbeat: beat},
			{Cluster: "Local", Name: "pg2", Address: netip.MustParseAddr("2001:db8::2"), Port: 5433, Role: "standby", HeartbeatAge: time.Duration(1<<63 - 1), Region: "eu", Zone: "eu-1a",
				Drain: Drain{ID: 7, Reason: "reindex", By: "alice", Until: beat.UnixMicro()}},
		},
		"net": {{Cluster: "net", Name: "n", Address: netip.MustParseAddr("10.1.0.0"), Network: netip.MustParsePrefix("10.1.0.0/16"), Port: 1}},
	}, aliases: []Alias{{Alias: "prod", Target: "local"}, {Alias: "x", Target: "prod"},
		{Alias: "dr-prod", Target: "local", Fallback: "dr,dr2", When: failNoNodes, After: 5 * time.Second, Failback: failbackAuto,
			Moved: "dr", Why: "no serving node in local for 5s", MovedAt: beat.UnixMicro()}}, aliasesSet: true,
		networks: []Network{{Network: netip.MustParsePrefix("10.0.0.0/16"), Region: "eu", Zone: "eu-1a"}, {Network: netip.MustParsePrefix("2001:db8::/56"), Zone: "b"}}, networksSet: true}, time.Now())

	u, err := updateFromCopy(allFields(rows), true)
	if err != nil {
		t.Fatal(err)
	}
	got := &rowSet{}
	got.merge(u, time.Now())
	for name, c := range rows.clusters {
		if !sameNodes(got.clusters[name].nodes, c.nodes) {
			t.Errorf("cluster %s: got %+v, want %+v", name, got.clusters[name].nodes, c.nodes)
		}
	}
	if len(got.clusters) != len(rows.clusters) || !maps.Equal(got.aliases, rows.aliases) {
		t.Errorf("got %d clusters and aliases %v, want %d and %v", len(got.clusters), got.aliases, len(rows.clusters), rows.aliases)
	}
	if !reflect.DeepEqual(got.networks, rows.networks) || len(got.networks) != 2 {
		t.Errorf("got networks %v, want %v", got.networks, rows.networks)
	}

	// A cluster gone is a nil field, which removes it.
	f := copyFields(rows, map[string]bool{"gone": true, "net": true}, false, false)
	if f[clusterField("gone")] != nil || f[clusterField("net")] == nil || len(f) != 2 {
		t.Fatalf("fields %v", f)
	}
	u, err = updateFromCopy(map[string][]byte{clusterField("net"): nil}, false)
	if err != nil {
		t.Fatal(err)
	}
	got.merge(u, time.Now())
	if _, ok := got.clusters["net"]; ok || len(got.clusters) != 1 {
		t.Errorf("after a nil field: %v", got.clusters)
	}
	// An instance older than fail-over reads [alias, target] alone: the
	// target is where the alias points now.
	var older [][2]string
	if err := json.Unmarshal(allFields(rows)[aliasesField], &older); err != nil || !slices.Contains(older, [2]string{"dr-prod", "dr"}) {
		t.Errorf("an older instance reads the aliases %v (%v), want dr-prod pointing at dr", older, err)
	}
	if _, err := updateFromCopy(map[string][]byte{aliasesField: []byte(`[["a","b","c"]]`)}, false); err == nil {
		t.Error("an alias of 3 strings was accepted")
	}
	if _, err := updateFromCopy(map[string][]byte{"other": []byte("x")}, false); err == nil {
		t.Error("an unknown field was accepted")
	}
	if _, err := updateFromCopy(map[string][]byte{clusterField("a"): []byte("{")}, false); err == nil {
		t.Error("a field that is not JSON was accepted")
	}
}

// A copy written before nodes had a place and networks existed still
// reads: its nodes have no place, and a full copy without the networks'
// field has no network. A copy of a registry without networks has no
// networks' field, so that an instance older than them reads it.
func TestRelayCopyWithoutPlaces(t *testing.T) {
	old := []byte(`[{"c":"local","n":"pg1","a":"10.0.0.1","p":5432,"r":"primary","h":true,"age":0}]`)
	u, err := updateFromCopy(map[string][]byte{clusterField("local"): old, aliasesField: []byte(`[]`)}, true)
	if err != nil {
		t.Fatal(err)
	}
	if n := u.nodes["local"][0]; n.Region != "" || n.Zone != "" || n.Name != "pg1" {
		t.Errorf("old node read as %+v", n)
	}
	if !u.networksSet || u.networks != nil {
		t.Errorf("a full old copy: networks %v (set %v), want none, set", u.networks, u.networksSet)
	}
	rows := &rowSet{}
	rows.merge(u, time.Now())
	if _, ok := allFields(rows)[networksField]; ok {
		t.Error("a copy without networks has a networks field")
	}
	if _, err := updateFromCopy(map[string][]byte{networksField: []byte(`[{"net":"x"}]`)}, false); err == nil {
		t.Error("a network that is not one was accepted")
	}
}

// sameNodes compares rows, heartbeats as moments.
func sameNodes(a, b []Node) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if !x.Heartbeat.Equal(y.Heartbeat) {
			return false
		}
		x.Heartbeat, y.Heartbeat = time.Time{}, time.Time{}
		if !reflect.DeepEqual(x, y) {
			return false
		}
	}
	return true
}

// diff names what an answer would show: not a heartbeat's age alone, but
// its crossing stale_after; clusters gone from a full read; aliases.
func TestRelayDiff(t *testing.T) {
	n := Node{Cluster: "c", Name: "a", Address: netip.MustParseAddr("10.0.0.1"), Port: 5432, Healthy: true, HeartbeatAge: time.Second}
	rows := &rowSet{}
	rows.merge(rowsUpdate{full: true, nodes: map[string][]Node{"c": {n}, "d": {n}}, aliasesSet: true}, time.Now())
	older := n
	older.HeartbeatAge = 3 * time.Second
	stale := n
	stale.HeartbeatAge = time.Minute
	for _, tc := range []struct {
		name    string
		u       rowsUpdate
		changed []string
		aliases bool
	}{
		{"age only", rowsUpdate{nodes: map[string][]Node{"c": {older}}}, nil, false},
		{"stale", rowsUpdate{nodes: map[string][]Node{"c": {stale}}}, []string{"c"}, false},
		{"full without d", rowsUpdate{full: true, nodes: map[string][]Node{"c": {n}}, aliasesSet: true}, []string{"d"}, false},
		{"new cluster", rowsUpdate{nodes: map[string][]Node{"e": {n}}}, []string{"e"}, false},
		{"gone", rowsUpdate{nodes: map[string][]Node{"c": nil}}, []string{"c"}, false},
		{"alias", rowsUpdate{aliases: []Alias{{Alias: "p", Target: "c"}}, aliasesSet: true}, nil, true},
		{"networks", rowsUpdate{networks: []Network{{Network: netip.MustParsePrefix("10.0.0.0/8"), Zone: "a"}}, networksSet: true}, nil, false},
	} {
		changed, aliases, networks := rows.diff(tc.u, 10*time.Second)
		want := map[string]bool{}
		for _, c := range tc.changed {
			want[c] = true
		}
		if !maps.Equal(changed, want) || aliases != tc.aliases || networks != (tc.name == "networks") {
			t.Errorf("%s: changed %v aliases %v networks %v, want %v %v", tc.name, changed, aliases, networks, want, tc.aliases)
		}
	}
}
