package test

import (
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// TestRegistryReloadWhileDown reloads the Corefile while PostgreSQL is down:
// the reload does not wait for the registry, and the new instance answers at
// once from the rows the old one loaded, with its own new settings, and is
// ready. No node goes stale meanwhile, even past stale_after: nobody could
// write a heartbeat. Once PostgreSQL is back it follows the registry.
func TestRegistryReloadWhileDown(t *testing.T) {
	const staleAfter = 3 * time.Second
	pg := Registry(t)
	written := time.Now()
	pg.MustExec(t, demoRegistry)
	port, _ := proc.FreePort()
	readyPort, _ := proc.FreePort()
	corefile := func(ttl int) string {
		return fmt.Sprintf("%s:%d {\n bind 127.0.0.1\n ready 127.0.0.1:%d\n pgcluster {\n  postgres %s\n  ttl %d\n  stale_after %s\n }\n}\n",
			Zone, port, readyPort, pg.DSN(""), ttl, staleAfter)
	}
	s := StartCoreDNS(t, corefile(5))
	check := func(ttl uint32) error {
		r, err := Exchange("udp", s.UDP, "local."+Zone, dns.TypeA)
		if err != nil {
			return err
		}
		if got := Addrs(r); r.Rcode != dns.RcodeSuccess || len(got) != 2 || got[0] != "192.0.2.11" || got[1] != "192.0.2.12" {
			return fmt.Errorf("rcode %s, addresses %v", dns.RcodeToString[r.Rcode], got)
		}
		if got := r.Answer[0].Header().Ttl; got != ttl {
			return fmt.Errorf("TTL %d, want %d", got, ttl)
		}
		return nil
	}
	if err := check(5); err != nil {
		t.Fatal(err)
	}

	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	// Let the heartbeats, as loaded, pass stale_after.
	time.Sleep(time.Until(written.Add(staleAfter + 500*time.Millisecond)))
	for _, ttl := range []uint32{7, 9} {
		start := time.Now()
		if err := s.Restart(corefile(int(ttl))); err != nil {
			t.Fatal(err)
		}
		took := time.Since(start)
		t.Logf("Corefile reload (ttl %d) with PostgreSQL down took %v", ttl, took)
		if took > 3*time.Second {
			t.Errorf("the reload took %v: it waited for the registry", took)
		}
		// At once: no polling.
		if err := check(ttl); err != nil {
			t.Fatalf("right after the reload to ttl %d: %v", ttl, err)
		}
		if _, err := get(fmt.Sprintf("http://127.0.0.1:%d/ready", readyPort)); err != nil {
			t.Errorf("not ready after the reload: %v", err)
		}
	}

	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	pg.MustExec(t, "UPDATE pgcluster_nodes SET address = '192.0.2.41', heartbeat = now() WHERE name = 'pg1'")
	Eventually(t, 15*time.Second, func() error { return hasAddr(s, "pg1.local."+Zone, "192.0.2.41") })
}
