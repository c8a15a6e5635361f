package pgcluster

import (
	"maps"
	"net/netip"
	"reflect"
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
			{Cluster: "Local", Name: "pg2", Address: netip.MustParseAddr("2001:db8::2"), Port: 5433, Role: "standby", HeartbeatAge: time.Duration(1<<63 - 1)},
		},
		"net": {{Cluster: "net", Name: "n", Address: netip.MustParseAddr("10.1.0.0"), Network: netip.MustParsePrefix("10.1.0.0/16"), Port: 1}},
	}, aliases: []Alias{{"prod", "local"}, {"x", "prod"}}, aliasesSet: true}, time.Now())

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

	// A cluster gone is a nil field, which removes it.
	f := copyFields(rows, map[string]bool{"gone": true, "net": true}, false)
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
	if _, err := updateFromCopy(map[string][]byte{"other": []byte("x")}, false); err == nil {
		t.Error("an unknown field was accepted")
	}
	if _, err := updateFromCopy(map[string][]byte{clusterField("a"): []byte("{")}, false); err == nil {
		t.Error("a field that is not JSON was accepted")
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
		{"alias", rowsUpdate{aliases: []Alias{{"p", "c"}}, aliasesSet: true}, nil, true},
	} {
		changed, aliases := rows.diff(tc.u, 10*time.Second)
		want := map[string]bool{}
		for _, c := range tc.changed {
			want[c] = true
		}
		if !maps.Equal(changed, want) || aliases != tc.aliases {
			t.Errorf("%s: changed %v aliases %v, want %v %v", tc.name, changed, aliases, want, tc.aliases)
		}
	}
}
