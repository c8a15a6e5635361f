package test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// TestReadyAndMetrics scrapes the ready and prometheus plugins of a server
// whose registry has a row that cannot be served.
func TestReadyAndMetrics(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, demoRegistry+`
INSERT INTO pgcluster_nodes(cluster, name, address) VALUES ('local', 'bad_name', '192.0.2.99');`)
	readyPort, _ := proc.FreePort()
	metricsPort, _ := proc.FreePort()
	corefile := fmt.Sprintf("%s:0 {\n bind 127.0.0.1\n ready 127.0.0.1:%d\n prometheus 127.0.0.1:%d\n pgcluster {\n  postgres %s\n }\n}\n",
		Zone, readyPort, metricsPort, pg.DSN(""))
	StartCoreDNS(t, corefile)

	Eventually(t, 10*time.Second, func() error {
		_, err := get(fmt.Sprintf("http://127.0.0.1:%d/ready", readyPort))
		return err
	})
	body, err := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`coredns_pgcluster_nodes{cluster="local",state="in",zone="pgcluster.lan."} 3`,
		`coredns_pgcluster_nodes{cluster="local",state="out",zone="pgcluster.lan."} 1`,
		`coredns_pgcluster_primaries{cluster="local",zone="pgcluster.lan."} 1`,
		`coredns_pgcluster_registry_up{zone="pgcluster.lan."} 1`,
		`coredns_pgcluster_rows_skipped{reason="invalid_name",zone="pgcluster.lan."} 1`,
		`coredns_pgcluster_registry_reloads_total{result="ok",zone="pgcluster.lan."}`,
		`coredns_pgcluster_registry_load_timestamp_seconds{zone="pgcluster.lan."}`,
		`coredns_pgcluster_snapshot_serial{zone="pgcluster.lan."}`,
		`coredns_pgcluster_registry_reload_duration_seconds_count{zone="pgcluster.lan."}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// PostgreSQL down: registry_up drops to 0 while answers go on.
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, func() error {
		body, err := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
		if err != nil {
			return err
		}
		if !strings.Contains(body, `coredns_pgcluster_registry_up{zone="pgcluster.lan."} 0`) {
			return fmt.Errorf("registry_up not 0 yet")
		}
		return nil
	})
	if _, err := get(fmt.Sprintf("http://127.0.0.1:%d/ready", readyPort)); err != nil {
		t.Errorf("still ready with the last snapshot: %v", err)
	}
}

// get GETs url and returns the body, or an error unless it answers 200.
func get(url string) (string, error) {
	code, body, err := scrape(url)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("%s: HTTP %d", url, code)
	}
	return body, err
}

// TestStaleAfter lets heartbeats age: nodes leave the answer once their
// heartbeat is older than stale_after, without any change to the table, and
// come back with a fresh heartbeat.
func TestStaleAfter(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, demoRegistry)
	s := StartCoreDNS(t, Corefile(pg.DSN(""), "stale_after 1s", "refresh 1h"))
	if got := Addrs(MustQuery(t, "udp", s.UDP, "local."+Zone, dns.TypeA)); len(got) != 2 {
		t.Fatalf("fresh heartbeats: %v", got)
	}
	start := time.Now()
	Eventually(t, 10*time.Second, func() error {
		r := MustQuery(t, "udp", s.UDP, "local."+Zone, dns.TypeA)
		if got := Addrs(r); len(got) != 0 || r.Rcode != dns.RcodeSuccess {
			return fmt.Errorf("stale nodes still served: %v", got)
		}
		return nil
	})
	t.Logf("stale after %v (stale_after 1s)", time.Since(start))
	txt := MustQuery(t, "udp", s.UDP, "pg1.local."+Zone, dns.TypeTXT)
	if len(txt.Answer) != 1 || !strings.Contains(txt.Answer[0].String(), `"reason=stale" "detail=heartbeat `) || !strings.Contains(txt.Answer[0].String(), "stale_after 1s") {
		t.Errorf("TXT should say the heartbeat is stale: %v", txt.Answer)
	}
	pg.MustExec(t, "UPDATE pgcluster_nodes SET heartbeat = now() WHERE name = 'pg2'")
	Eventually(t, 5*time.Second, func() error { return hasAddr(s, "local."+Zone, "192.0.2.12") })
}

// TestCorefileReload restarts the server with a changed Corefile, as the
// reload plugin does: the old registry follower stops, the new one serves
// the new settings.
func TestCorefileReload(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, demoRegistry)
	port, _ := proc.FreePort()
	corefile := func(ttl int) string {
		return fmt.Sprintf("%s:%d {\n bind 127.0.0.1\n pgcluster {\n  postgres %s\n  ttl %d\n }\n}\n", Zone, port, pg.DSN(""), ttl)
	}
	s := StartCoreDNS(t, corefile(5))
	ttl := func() uint32 {
		r := MustQuery(t, "udp", s.UDP, "local."+Zone, dns.TypeA)
		if len(r.Answer) == 0 {
			t.Fatalf("no answer: %v", r)
		}
		return r.Answer[0].Header().Ttl
	}
	if got := ttl(); got != 5 {
		t.Fatalf("TTL %d, want 5", got)
	}
	if err := s.Restart(corefile(7)); err != nil {
		t.Fatal(err)
	}
	if got := ttl(); got != 7 {
		t.Errorf("after the reload: TTL %d, want 7", got)
	}
	// The new instance follows the registry, and the old one let go of it.
	pg.MustExec(t, "UPDATE pgcluster_nodes SET address = '192.0.2.41' WHERE name = 'pg1'")
	Eventually(t, 5*time.Second, func() error { return hasAddr(s, "pg1.local."+Zone, "192.0.2.41") })
	ctx := Ctx(t)
	Eventually(t, 5*time.Second, func() error {
		conn, err := pgx.Connect(ctx, pg.DSN(""))
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		var n int
		err = conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'coredns-pgcluster'").Scan(&n)
		if err == nil && n != 1 {
			err = fmt.Errorf("%d registry connections, want 1", n)
		}
		return err
	})
}
