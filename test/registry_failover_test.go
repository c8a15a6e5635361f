package test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// TestRegistryFailover: bin/coredns follows its registry through a
// fail-over without a restart. The DSN names two hosts, the registry's
// primary and its streaming standby, with target_session_attrs=read-write;
// the primary is stopped at once (as by a crash) and the standby promoted.
// The instance keeps answering from its snapshot meanwhile, connects to the
// new primary, and a change committed there reaches its answers; the time
// from that commit to the answer is logged, and so is the time a change
// takes once it is connected. A drain made before the fail-over holds
// through it, and its deletion on the new primary ends it. The reconnect's log line must name the host
// and port actually connected (the standby's), not the DSN's first.
func TestRegistryFailover(t *testing.T) {
	primary := pgtest.New(t)
	primary.MustExec(t, pgcluster.Schema)
	primary.MustExec(t, "INSERT INTO pgcluster_nodes(name, address, role) VALUES ('pg1', '127.0.0.11', 'primary')")
	standby := pgtest.NewStandby(t, primary)
	dsn := fmt.Sprintf("host=%s,%s port=%d,%d user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write connect_timeout=2",
		primary.Host, standby.Host, primary.Port, standby.Port)

	in := StartFleetInstance(t, securityCorefile(dsn))
	Eventually(t, 10*time.Second, answersOf(in, "127.0.0.11"))
	primary.MustExec(t, "INSERT INTO pgcluster_nodes(name, address, role) VALUES ('pg2', '127.0.0.12', 'standby')")
	Eventually(t, 10*time.Second, answersOf(in, "127.0.0.11", "127.0.0.12"))
	// A drain is in the registry: it holds through the fail-over.
	primary.MustExec(t, "INSERT INTO pgcluster_drains(cluster, node, reason) VALUES ('local', 'pg2', 'held across a registry fail-over')")
	Eventually(t, 10*time.Second, answersOf(in, "127.0.0.11"))
	caughtUp(t, primary, standby, 10*time.Second)

	stopped := time.Now()
	if err := primary.Stop(); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, metricIs(t, in, registryUp, 0))
	t.Logf("primary %s stopped: registry_up 0 after %v", primary.HostPort(), time.Since(stopped).Round(time.Millisecond))
	holdsFor(t, 500*time.Millisecond, "answers while the registry has no primary", answersOf(in, "127.0.0.11"))

	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	standby.MustExec(t, "INSERT INTO pgcluster_nodes(name, address, role) VALUES ('pg3', '127.0.0.13', 'standby')")
	committed := time.Now()
	want := []string{"127.0.0.11", "127.0.0.13"}
	followed := answeredAt(t, in, 20*time.Second, want)
	t.Logf("standby %s promoted; a change committed there %v after the promotion reached the answer %v after the commit (%v after the promotion)",
		standby.HostPort(), committed.Sub(promoted).Round(time.Millisecond), followed.Sub(committed).Round(time.Millisecond), followed.Sub(promoted).Round(time.Millisecond))
	Eventually(t, 5*time.Second, metricIs(t, in, registryUp, 1))

	// Connected to the new primary: a change takes a notification's time.
	standby.MustExec(t, "DELETE FROM pgcluster_drains; INSERT INTO pgcluster_nodes(name, address, role) VALUES ('pg4', '127.0.0.14', 'standby')")
	committed = time.Now()
	followed = answeredAt(t, in, 10*time.Second, append(want, "127.0.0.12", "127.0.0.14"))
	t.Logf("once connected to the new primary, a change reached the answer %v after its commit", followed.Sub(committed).Round(time.Millisecond))

	line := waitLogged(t, in, 5*time.Second, "Registry", "reachable again")
	t.Logf("reconnect: %s", line)
	if !containsAll(line, []string{standby.HostPort() + "/postgres"}) {
		t.Errorf("the reconnect line names %s, the DSN's first host, not %s, the host connected: %q", primary.HostPort(), standby.HostPort(), line)
	}
}

// answeredAt polls the instance every millisecond until it answers
// local.<Zone> with exactly hosts, and returns when it first did.
func answeredAt(t testing.TB, in *Instance, timeout time.Duration, hosts []string) time.Time {
	t.Helper()
	want := slices.Sorted(slices.Values(hosts))
	deadline := time.Now().Add(timeout)
	var last []string
	for time.Now().Before(deadline) {
		got, err := answers(in)
		if err == nil && slices.Equal(got, want) {
			return time.Now()
		}
		last = got
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("%s did not answer %v within %v; last %v", in.Addr(), want, timeout, last)
	return time.Time{}
}
