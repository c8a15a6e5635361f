package test

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// A planned switchover at the default interval (2s), the way a client of
// primary. meets it: the primary is stopped in fast mode and a standby
// promoted at once. The session of role_interval sees both, so primary.
// names the new primary soon after the promotion, long before the probes of
// interval could, and never answers without an address meanwhile (the old
// primary is held). Then a standby of the new primary is promoted while the
// new primary keeps running: by default primary. has no address (split
// brain, said in its TXT); with split_brain newest_timeline the promoted one,
// on the newer timeline, is primary. and the other is answered nowhere.
func TestCheckPromotion(t *testing.T) {
	pg1 := pgtest.New(t, pgtest.Options{Host: "127.0.0.71"})
	pg2 := pgtest.NewStandby(t, pg1, pgtest.Options{Host: "127.0.0.72"})
	reg := Registry(t)
	reg.MustExec(t, fmt.Sprintf(`INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES
  ('local', 'pg1', '127.0.0.71', %d, 'primary'),
  ('local', 'pg2', '127.0.0.72', %d, 'standby')`, pg1.Port, pg2.Port))
	corefile := func(extra ...string) string {
		return fmt.Sprintf("%s:0 {\n bind 127.0.0.1\n pgcluster {\n  postgres %s\n  allow_loopback\n  ttl 1\n  %s\n }\n}\n",
			Zone, reg.DSN(""), strings.Join(append([]string{`check postgres "user=postgres dbname=postgres sslmode=disable"`}, extra...), "\n  "))
	}
	closed := StartCoreDNS(t, corefile())
	newest := StartCoreDNS(t, corefile("split_brain newest_timeline"))
	const primary = "primary.local." + Zone
	for _, s := range []*Server{closed, newest} {
		Eventually(t, 20*time.Second, func() error { return hasAddr(s, primary, "127.0.0.71") })
		Eventually(t, 20*time.Second, func() error { return hasAddr(s, "standby.local."+Zone, "127.0.0.72") })
		// Judged up by the check (rise 2 at interval 2s), not by the
		// registry alone: only then does its session's role count.
		wantTXT(t, s, "pg1.local."+Zone, `"check=postgres up"`)
		wantTXT(t, s, "pg2.local."+Zone, `"check=postgres up"`)
	}
	wantTXT(t, closed, primary, `"state=serving" "node=pg1"`)

	// Poll primary. on both every 10 ms through the switchover.
	var (
		nodata atomic.Int64
		polls  atomic.Int64
		stop   = make(chan struct{})
		wg     sync.WaitGroup
	)
	for _, s := range []*Server{closed, newest} {
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				r, err := Exchange("udp", s.UDP, primary, dns.TypeA)
				if err != nil {
					continue
				}
				polls.Add(1)
				if r.Rcode == dns.RcodeSuccess && len(Addrs(r)) == 0 {
					nodata.Add(1)
				}
			}
		})
	}
	var promoted time.Time
	var stopErr, promoteErr error
	var sw sync.WaitGroup
	sw.Go(func() { stopErr = pg1.StopMode("fast") })
	sw.Go(func() { promoteErr = pg2.Promote(); promoted = time.Now() })
	sw.Wait()
	if stopErr != nil || promoteErr != nil {
		t.Fatalf("switchover: stop %v, promote %v", stopErr, promoteErr)
	}
	for _, s := range []*Server{closed, newest} {
		Eventually(t, 10*time.Second, func() error { return hasAddr(s, primary, "127.0.0.72") })
	}
	took := time.Since(promoted)
	close(stop)
	wg.Wait()
	t.Logf("pg_ctl promote -w returned; primary. named the new primary on both instances %v later; %d of %d polls of primary. without an address",
		took.Round(time.Millisecond), nodata.Load(), polls.Load())
	if nodata.Load() > 0 {
		t.Errorf("primary. answered without an address %d times during a planned switchover, want never (the old primary is held)", nodata.Load())
	}
	// The probes of interval 2s with rise 2 would take seconds; the session
	// a few polls. A generous bound for a loaded machine.
	if took > 1500*time.Millisecond {
		t.Errorf("primary. named the new primary %v after the promotion, want within about role_interval (100ms)", took)
	}
	wantTXT(t, closed, primary, `"state=serving" "node=pg2"`)

	// A standby of the new primary, promoted while it keeps running: it
	// moves to timeline 3, the running primary is on timeline 2.
	pg3 := pgtest.NewStandby(t, pg2, pgtest.Options{Host: "127.0.0.73"})
	reg.MustExec(t, fmt.Sprintf(`INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES ('local', 'pg3', '127.0.0.73', %d, 'standby')`, pg3.Port))
	for _, s := range []*Server{closed, newest} {
		Eventually(t, 20*time.Second, func() error { return hasAddr(s, "standby.local."+Zone, "127.0.0.73") })
		wantTXT(t, s, "pg3.local."+Zone, `"check=postgres up"`)
	}
	if err := pg3.Promote(); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, func() error { return hasAddr(closed, primary) })
	wantTXT(t, closed, primary, `"state=split_brain" "primaries=2"`)
	Eventually(t, 10*time.Second, func() error { return hasAddr(newest, primary, "127.0.0.73") })
	Eventually(t, 10*time.Second, func() error { return hasAddr(newest, "local."+Zone, "127.0.0.73") })
	wantTXT(t, newest, "pg2.local."+Zone, `"reason=stale_primary"`)
	wantTXT(t, newest, "pg2.local."+Zone, `timeline 2 < 3`)
}

// wantTXT fails unless the TXT record of name on s holds want.
func wantTXT(t *testing.T, s *Server, name, want string) {
	t.Helper()
	Eventually(t, 10*time.Second, func() error {
		r, err := Exchange("udp", s.UDP, name, dns.TypeTXT)
		if err != nil {
			return err
		}
		if len(r.Answer) != 1 || !strings.Contains(r.Answer[0].String(), want) {
			return fmt.Errorf("TXT of %s: %v, want %s", name, r.Answer, want)
		}
		return nil
	})
}
