package pgcluster

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// Judge says of each node what an instance's TXT says (state and reason),
// from the registry and the checks' verdicts; keeps the registry's role
// apart from the role a check reads; measures lag; and lists the rows an
// instance skips, with the instance's reasons.
func TestJudge(t *testing.T) {
	addr := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	nodes := []Node{
		{Cluster: "Local", Name: "pg1", Address: addr("192.0.2.1"), Port: 5432, Role: "standby", Healthy: true},
		{Cluster: "local", Name: "pg2", Address: addr("192.0.2.2"), Port: 5432, Role: " Standby", Healthy: true},
		{Cluster: "local", Name: "pg3", Address: addr("192.0.2.3"), Port: 5432, Role: "standby", Healthy: true},
		{Cluster: "local", Name: "pg4", Address: addr("192.0.2.4"), Port: 5432, Role: "standby", Healthy: false},
		{Cluster: "local", Name: "pg5", Address: addr("192.0.2.5"), Port: 5432, Role: "standby", Healthy: true, HeartbeatAge: time.Hour},
		{Cluster: "local", Name: "lo", Address: addr("127.0.0.1"), Port: 5432, Role: "standby", Healthy: true},
		{Cluster: "local", Name: "bad_name", Address: addr("192.0.2.9"), Port: 5432, Healthy: true},
		{Cluster: "local", Name: "PG2", Address: addr("192.0.2.8"), Port: 5432, Healthy: true},
		{Cluster: "ns", Name: "x", Address: addr("192.0.2.7"), Port: 5432, Healthy: true},
	}
	view := health.ViewOf(map[string]health.Verdict{
		"local/pg1": {State: health.Up, Role: "primary", WAL: 1000},
		"local/pg2": {State: health.Up, Role: "standby", WAL: 400},
		"local/pg3": {State: health.Down, Cause: "refused", Detail: "connection refused"},
	})
	cs, err := Judge(nodes, view, JudgeOptions{Zone: "pgcluster.lan", StaleAfter: time.Minute, Check: "tcp", MaxLag: 500})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].Name != "local" || cs[1].Name != "ns" {
		t.Fatalf("clusters %+v, want local and ns", cs)
	}
	type want struct {
		name, state, reason, registry, role, registryRole string
		lag                                               int64
		lagging                                           bool
	}
	var got []want
	for _, j := range cs[0].Nodes {
		state := "out"
		if j.Serving {
			state = "in"
		}
		got = append(got, want{j.Name, state, j.Reason, j.RegistryReason, j.Role, j.RegistryRole, j.Lag, j.Lagging})
	}
	wants := []want{
		{"lo", "out", "loopback", "loopback", "standby", "standby", -1, false},
		{"pg1", "in", "serving", "serving", "primary", "standby", -1, false}, // lag is a standby's
		{"pg2", "in", "serving", "serving", "standby", "standby", 600, true},
		{"pg3", "out", "check_refused", "serving", "standby", "standby", -1, false},
		{"pg4", "out", "unhealthy", "unhealthy", "standby", "standby", -1, false},
		{"pg5", "out", "stale", "stale", "standby", "standby", -1, false},
	}
	if !slices.Equal(got, wants) {
		t.Errorf("judged:\n%+v\nwant:\n%+v", got, wants)
	}
	if c := cs[0]; c.Serving != 2 || c.Out != 4 || !slices.Equal(c.Primaries, []string{"pg1"}) {
		t.Errorf("local: %d serving, %d out, primaries %v; want 2, 4, [pg1]", c.Serving, c.Out, c.Primaries)
	}
	var skipped []string
	for _, c := range cs {
		for _, sk := range c.Skipped {
			skipped = append(skipped, sk.Reason+" "+sk.Row)
		}
	}
	if want := []string{`invalid_name node "bad_name" in cluster "local"`, `duplicate node "PG2" in cluster "local"`,
		`reserved_name node "x" in cluster "ns"`}; !slices.Equal(skipped, want) {
		t.Errorf("skipped %q, want %q", skipped, want)
	}
	// Without checks the verdicts are the registry's, and lag is unknown.
	cs, err = Judge(nodes, view, JudgeOptions{Zone: "pgcluster.lan", AllowLoopback: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range cs[0].Nodes {
		if j.Name == "pg3" && (!j.Serving || j.Check.State != health.Unknown || j.Lag != -1) {
			t.Errorf("pg3 without checks: %+v, want serving, unchecked, lag unknown", j)
		}
		if j.Name == "pg5" && !j.Serving {
			t.Errorf("pg5 without stale_after: out (%s), want in", j.Reason)
		}
		if j.Name == "lo" && !j.Serving {
			t.Errorf("lo with allow_loopback: out (%s), want in", j.Reason)
		}
	}
	if _, err := Judge(nodes, health.View{}, JudgeOptions{Zone: "bad..zone"}); err == nil {
		t.Error("zone bad..zone: no error")
	}
}
