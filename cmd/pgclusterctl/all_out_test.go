package main

import (
	"strings"
	"testing"
)

// When every node is out for one reason, status says so and what to do,
// after the clusters' lines: a registry of loopback addresses (the demo's)
// read without -allow-loopback, every heartbeat older than -stale-after,
// every node marked unhealthy. Nodes out for different reasons, or one
// serving, get no such line.
func TestStatusAllOutForOneReason(t *testing.T) {
	reg := registry(t)
	reg.MustExec(t, `INSERT INTO pgcluster_nodes (cluster, name, address, role) VALUES
		('local', 'pg1', '127.0.0.11', 'primary'), ('local', 'pg2', '127.0.0.12', 'standby'),
		('other', 'o1', '127.0.0.13', 'primary')`)
	args := []string{"-postgres", reg.DSN("")}
	for _, step := range []struct {
		sql  string
		args []string
		want string // "" for no line
	}{
		{"", nil, "NO SERVING PRIMARY: primary.other has no address\n" +
			"every node is out for one reason, loopback: their addresses are loopback addresses, which the fleet answers only with allow_loopback; if its Corefile has allow_loopback (the demo's does), use -allow-loopback\n" +
			"2 of 2 clusters served without exactly one serving primary\n"},
		{"", []string{"-allow-loopback"}, ""},
		{"UPDATE pgcluster_nodes SET heartbeat = now() - interval '1 hour'", []string{"-allow-loopback", "-stale-after", "10s"},
			"every node is out for one reason, stale: every heartbeat is older than -stale-after 10s; whatever writes the heartbeats (UPDATE pgcluster_nodes SET heartbeat = now()) has stopped, or -stale-after is not the fleet's stale_after\n"},
		{"UPDATE pgcluster_nodes SET healthy = false", []string{"-allow-loopback"},
			"every node is out for one reason, unhealthy: the registry marks every node unhealthy (healthy = false)\n"},
		// Two reasons: no line.
		{"UPDATE pgcluster_nodes SET healthy = true WHERE name = 'o1'", nil, ""},
	} {
		if step.sql != "" {
			reg.MustExec(t, step.sql)
		}
		code, out, errOut := status(t, append(args, step.args...)...)
		switch {
		case code != exitNotOK && step.want != "":
			t.Errorf("after %q %v: exit %d, want %d", step.sql, step.args, code, exitNotOK)
		case step.want == "" && strings.Contains(out, "every node is out for one reason"):
			t.Errorf("after %q %v: a line says every node is out for one reason:\n%s%s", step.sql, step.args, out, errOut)
		case !strings.Contains(out, step.want):
			t.Errorf("after %q %v: want %q in\n%s%s", step.sql, step.args, step.want, out, errOut)
		}
		if step.want == "" {
			continue
		}
		_, r := statusJSON(t, append(args, step.args...)...)
		if r.AllOut == nil || !strings.Contains(step.want, "one reason, "+r.AllOut.Reason+": "+r.AllOut.Hint+"\n") {
			t.Errorf("after %q %v: JSON all_out %+v, want it in %q", step.sql, step.args, r.AllOut, step.want)
		}
	}
}
