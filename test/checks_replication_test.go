package test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/proc"
)

// Real streaming replication, with the registry's role column deliberately
// wrong: primary. and standby. follow pg_is_in_recovery(); sync. answers
// the standby the primary replicates to synchronously (named by its
// cluster_name, which its walreceiver takes as application_name); max_lag
// takes a standby whose replay is paused out of standby. and sync.; a
// promotion while the old primary still runs empties primary. and sync.
// (split brain); stopping the old primary makes primary. name the new one.
func TestCheckReplication(t *testing.T) {
	ctx := context.Background()
	primary := pgtest.New(t, pgtest.Options{Host: "127.0.0.31", Settings: map[string]string{"synchronous_standby_names": "pg2"}})
	standby := pgtest.NewStandby(t, primary, pgtest.Options{Host: "127.0.0.32", Settings: map[string]string{"cluster_name": "pg2"}})
	reg := Registry(t)
	// Wrong on purpose: the registry calls the primary a standby and the
	// standby the primary.
	reg.MustExec(t, fmt.Sprintf(`INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES
  ('local', 'pg1', '127.0.0.31', %d, 'standby'),
  ('local', 'pg2', '127.0.0.32', %d, 'primary')`, primary.Port, standby.Port))
	metricsPort, _ := proc.FreePort()
	corefile := fmt.Sprintf("%s:0 {\n bind 127.0.0.1\n prometheus 127.0.0.1:%d\n pgcluster {\n  postgres %s\n  allow_loopback\n  %s\n }\n}\n",
		Zone, metricsPort, reg.DSN(""), strings.Join([]string{
			`check postgres "user=postgres dbname=postgres sslmode=disable"`,
			"interval 250ms", "timeout 200ms", "rise 2", "fall 2", "max_lag 64kB", "all_down closed",
		}, "\n  "))
	s := StartCoreDNS(t, corefile)
	steps := newAnswerSteps(t)
	step := func(what string, name string, want ...string) { t.Helper(); steps.wait(what, s, name, want...) }
	step("primary. follows pg_is_in_recovery(), not the registry", "primary.local.", "127.0.0.31")
	step("standby. too", "standby.local.", "127.0.0.32")
	step("sync.: the synchronous standby", "sync.local.", "127.0.0.32")
	txt := MustQuery(t, "udp", s.UDP, "pg1.local."+Zone, dns.TypeTXT)
	if len(txt.Answer) != 1 || !strings.Contains(txt.Answer[0].String(), `"role=primary"`) || !strings.Contains(txt.Answer[0].String(), `"check_role=primary"`) {
		t.Errorf("pg1 TXT: %v", txt.Answer)
	}
	if txt := MustQuery(t, "udp", s.UDP, "pg2.local."+Zone, dns.TypeTXT); len(txt.Answer) != 1 || !strings.Contains(txt.Answer[0].String(), `"sync_state=sync"`) {
		t.Errorf("pg2 TXT: %v", txt.Answer)
	}

	// max_lag: pause replay, write more than 64 kB of WAL on the primary.
	if err := standby.PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	primary.MustExec(t, "CREATE TABLE filler AS SELECT g, repeat('x', 200) AS pad FROM generate_series(1, 2000) g")
	step("replay paused, ~0.5 MB written: standby leaves standby.", "standby.local.")
	step("... and sync.", "sync.local.")
	step("... but stays in local.", "local.", "127.0.0.31", "127.0.0.32")
	txt = MustQuery(t, "udp", s.UDP, "pg2.local."+Zone, dns.TypeTXT)
	if len(txt.Answer) != 1 || !strings.Contains(txt.Answer[0].String(), "over max_lag 65536") {
		t.Errorf("pg2 TXT while lagging: %v", txt.Answer)
	}
	if err := standby.ResumeReplay(ctx); err != nil {
		t.Fatal(err)
	}
	step("replay resumed: the standby returns", "standby.local.", "127.0.0.32")
	step("... to sync. too", "sync.local.", "127.0.0.32")

	// Promote the standby while the old primary still runs: two primaries.
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	step("standby promoted, old primary still up: split brain", "primary.local.")
	step("... sync. has no primary to vouch for it", "sync.local.")
	step("... local. keeps both", "local.", "127.0.0.31", "127.0.0.32")
	Eventually(t, 10*time.Second, func() error {
		body, err := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
		if err != nil || !strings.Contains(body, `coredns_pgcluster_split_brain_clusters{zone="pgcluster.lan."} 1`) {
			return fmt.Errorf("split_brain_clusters is not 1 (%v)", err)
		}
		return nil
	})
	if err := primary.Stop(); err != nil {
		t.Fatal(err)
	}
	step("old primary stopped: primary. names the new one", "primary.local.", "127.0.0.32")
	step("... and local. only it", "local.", "127.0.0.32")
}
