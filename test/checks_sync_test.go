package test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// Real synchronous replication (synchronous_standby_names FIRST 1 (pg2),
// pg3 asynchronous, each standby named by its cluster_name): sync.
// answers pg2 alone; naming pg3 instead and reloading moves sync. to pg3
// at the primary's next probe. An instance whose check role lacks
// pg_monitor says no_privilege rather than answer an empty sync. in
// silence. With max_lag 1s, pg3's replay paused under a write load takes
// it out of standby. and sync. once replay_lag passes a second, and
// resuming brings it back.
func TestCheckSyncReplication(t *testing.T) {
	const syncInterval, syncTimeout = time.Second, 900 * time.Millisecond
	ctx := context.Background()
	primary := pgtest.New(t, pgtest.Options{Host: "127.0.0.41", Settings: map[string]string{"synchronous_standby_names": "FIRST 1 (pg2)"}})
	// One after the other: two pg_basebackups of one primary at once
	// failed once in CI (its WAL streamer ended unexpectedly).
	var standbys [2]*pgtest.Postgres
	for i, name := range []string{"pg2", "pg3"} {
		standbys[i] = pgtest.NewStandby(t, primary, pgtest.Options{Host: fmt.Sprintf("127.0.0.%d", 42+i), Settings: map[string]string{"cluster_name": name}})
	}
	primary.MustExec(t, "CREATE ROLE bare LOGIN; CREATE TABLE load (at timestamptz DEFAULT now())")
	reg := Registry(t)
	reg.MustExec(t, fmt.Sprintf(`INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES
  ('local', 'pg1', '127.0.0.41', %d, 'primary'), ('local', 'pg2', '127.0.0.42', %d, 'standby'), ('local', 'pg3', '127.0.0.43', %d, 'standby')`,
		primary.Port, standbys[0].Port, standbys[1].Port))
	corefile := func(user string, more ...string) string {
		return fmt.Sprintf("%s:0 {\n bind 127.0.0.1\n pgcluster {\n  postgres %s\n  allow_loopback\n  %s\n }\n}\n",
			Zone, reg.DSN(""), strings.Join(append([]string{
				`check postgres "user=` + user + ` dbname=postgres sslmode=disable"`,
				// Generous: what is measured is which standbys are
				// answered, not how fast a loaded machine connects.
				"interval " + syncInterval.String(), "timeout " + syncTimeout.String(), "rise 1", "fall 3"}, more...), "\n  "))
	}
	s := StartCoreDNS(t, corefile("postgres", "max_lag 1s"))
	bare := StartCoreDNS(t, corefile("bare"))
	step := newAnswerSteps(t).wait
	txtHas := func(in *Server, name string, want string) {
		t.Helper()
		Eventually(t, 10*time.Second, func() error {
			r, err := Exchange("udp", in.UDP, name+Zone, dns.TypeTXT)
			if err != nil {
				return err
			}
			if len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), want) {
				return fmt.Errorf("TXT of %s: %v, want %s", name, r.Answer, want)
			}
			return nil
		})
	}
	step("sync.: pg2, which synchronous_standby_names names", s, "sync.local.", "127.0.0.42")
	step("standby.: both", s, "standby.local.", "127.0.0.42", "127.0.0.43")
	txtHas(s, "pg3.local.", `"sync_state=async"`)

	primary.MustExec(t, "ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (pg3)'")
	primary.MustExec(t, "SELECT pg_reload_conf()")
	took := step("synchronous_standby_names = pg3, reloaded: sync. moves", s, "sync.local.", "127.0.0.43")
	if bound := 2*syncInterval + syncTimeout + time.Second; took > bound {
		t.Errorf("sync. followed the reload after %v, over the checks' bound %v (an interval, a probe's timeout, slack)", took, bound)
	}

	// The role without pg_monitor sees walsenders, not their columns.
	step("without pg_monitor: sync. empty", bare, "sync.local.")
	txtHas(bare, "sync.local.", `"state=no_privilege"`)
	txtHas(bare, "pg2.local.", "no_privilege")
	step("... standby. still answers", bare, "standby.local.", "127.0.0.42", "127.0.0.43")

	// max_lag 1s: pause pg3's replay while the primary takes writes.
	if err := standbys[1].PauseReplay(ctx); err != nil {
		t.Fatal(err)
	}
	load, stopLoad := context.WithCancel(ctx)
	var loadDone sync.WaitGroup
	loadDone.Go(func() {
		conn, err := pgx.Connect(load, primary.DSN(""))
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		for load.Err() == nil {
			conn.Exec(load, "INSERT INTO load DEFAULT VALUES")
			select {
			case <-load.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	})
	defer func() { stopLoad(); loadDone.Wait() }()
	step("pg3's replay paused under writes: out of standby. (max_lag 1s)", s, "standby.local.", "127.0.0.42")
	step("... and out of sync.", s, "sync.local.")
	txtHas(s, "pg3.local.", "over max_lag 1s: out of standby.")
	step("... in local. still", s, "local.", "127.0.0.41", "127.0.0.42", "127.0.0.43")
	if err := standbys[1].ResumeReplay(ctx); err != nil {
		t.Fatal(err)
	}
	step("replay resumed: pg3 back in standby.", s, "standby.local.", "127.0.0.42", "127.0.0.43")
	step("... and in sync.", s, "sync.local.", "127.0.0.43")
}
