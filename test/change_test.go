package test

import (
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"
)

// TestChangeLatency commits changes to the registry and measures the time
// from COMMIT to the first answer that shows them. It asserts a generous
// bound; the figures are in the log (go test -v -run TestChangeLatency ./test/).
func TestChangeLatency(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, demoRegistry)
	// refresh 1h: only notifications can make the answers change in time.
	s := StartCoreDNS(t, Corefile(pg.DSN(""), "refresh 1h"))
	ctx := Ctx(t)
	conn, err := pgx.Connect(ctx, pg.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	const changes = 60
	var lat []time.Duration
	for i := range changes {
		var sql, name, want string
		if i%2 == 0 {
			// A node's address changes.
			want = fmt.Sprintf("192.0.2.%d", 100+i)
			sql = fmt.Sprintf("UPDATE pgcluster_nodes SET address = '%s' WHERE name = 'pg2'", want)
			name = "pg2.local." + Zone
		} else {
			// An alias changes target.
			want = fmt.Sprintf("c%d.%s", i, Zone)
			sql = fmt.Sprintf("INSERT INTO pgcluster_nodes(cluster, name, address) VALUES ('c%d', 'n', '192.0.2.200');"+
				"UPDATE pgcluster_aliases SET target = 'c%d' WHERE alias = 'prod'", i, i)
			name = "prod." + Zone
		}
		if _, err := conn.Exec(ctx, "BEGIN; "+sql+"; COMMIT"); err != nil {
			t.Fatal(err)
		}
		committed := time.Now()
		// Poll without pause: each query is a loopback round trip, and a
		// pause would be the measurement's resolution.
		deadline := committed.Add(5 * time.Second)
		for {
			err := answerIs(s, name, want)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("change %d not seen after 5s: %v", i, err)
			}
		}
		lat = append(lat, time.Since(committed))
	}
	p50, p99 := percentile(lat, 50), percentile(lat, 99)
	t.Logf("COMMIT -> changed answer over %d changes: p50 %v, p99 %v, max %v", changes, p50, p99, slices.Max(lat))
	if p99 > time.Second {
		t.Errorf("p99 %v: changes should show within a second (goal: 100ms)", p99)
	}
}

// answerIs checks that the first record of name's A answer is the address or
// CNAME target want.
func answerIs(s *Server, name, want string) error {
	r, err := Exchange("udp", s.UDP, name, dns.TypeA)
	if err != nil {
		return err
	}
	if len(r.Answer) == 0 {
		return fmt.Errorf("%s: empty answer", name)
	}
	switch rr := r.Answer[0].(type) {
	case *dns.A:
		if rr.A.String() == want {
			return nil
		}
	case *dns.CNAME:
		if rr.Target == want {
			return nil
		}
	}
	return fmt.Errorf("%s: %v, want %s", name, r.Answer[0], want)
}

func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Clone(d)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}

// TestRegistryDown stops PostgreSQL: answers keep coming from the last
// snapshot. Then the listener is kept out while a change is made; once it is
// let back in, the change shows.
func TestRegistryDown(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, demoRegistry+`
CREATE ROLE dns LOGIN;
GRANT SELECT ON pgcluster_nodes, pgcluster_aliases TO dns;`)
	dsn := fmt.Sprintf("postgres://dns@127.0.0.1:%d/postgres?sslmode=disable", pg.Port)
	s := StartCoreDNS(t, Corefile(dsn, "refresh 1h"))
	answers := func() error {
		for _, proto := range []string{"udp", "tcp"} {
			addr := map[string]string{"udp": s.UDP, "tcp": s.TCP}[proto]
			r, err := Exchange(proto, addr, "myapp-db."+Zone, dns.TypeA)
			if err != nil {
				return err
			}
			if r.Rcode != dns.RcodeSuccess || len(Addrs(r)) != 2 {
				return fmt.Errorf("%s: rcode %s, %d addresses", proto, dns.RcodeToString[r.Rcode], len(Addrs(r)))
			}
		}
		return nil
	}
	if err := answers(); err != nil {
		t.Fatal(err)
	}

	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	// While PostgreSQL is down, every answer comes from the last snapshot.
	for i := range 100 {
		if err := answers(); err != nil {
			t.Fatalf("query %d with PostgreSQL down: %v", i, err)
		}
	}
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	pg.MustExec(t, "UPDATE pgcluster_nodes SET address = '192.0.2.21' WHERE name = 'pg1'")
	Eventually(t, 15*time.Second, func() error { return hasAddr(s, "pg1.local."+Zone, "192.0.2.21") })

	// Keep the listener out, change the registry, let it back in.
	pg.MustExec(t, `ALTER ROLE dns NOLOGIN;
SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'dns';`)
	pg.MustExec(t, "UPDATE pgcluster_nodes SET address = '192.0.2.31' WHERE name = 'pg1'")
	for i := range 20 {
		if err := hasAddr(s, "pg1.local."+Zone, "192.0.2.21"); err != nil {
			t.Fatalf("query %d with the listener out: %v", i, err)
		}
	}
	pg.MustExec(t, "ALTER ROLE dns LOGIN")
	Eventually(t, 15*time.Second, func() error { return hasAddr(s, "pg1.local."+Zone, "192.0.2.31") })
}

// answerSteps waits for a test's steps, each an answer that must come, and
// logs when each came, from the test's start and from the step's.
type answerSteps struct {
	t     *testing.T
	start time.Time
}

func newAnswerSteps(t *testing.T) *answerSteps { return &answerSteps{t: t, start: time.Now()} }

// wait waits up to 20 s until in answers name with exactly want (none:
// NODATA), and returns how long that took.
func (a *answerSteps) wait(what string, in *Server, name string, want ...string) time.Duration {
	a.t.Helper()
	begin := time.Now()
	Eventually(a.t, 20*time.Second, func() error {
		if err := hasAddr(in, name+Zone, want...); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		return nil
	})
	took := time.Since(begin)
	a.t.Logf("%8.3fs  %-60s after %v", time.Since(a.start).Seconds(), what, took.Round(time.Millisecond))
	return took
}

// hasAddr checks that name's A answer holds exactly the addresses want (none
// when want is empty).
func hasAddr(s *Server, name string, want ...string) error {
	r, err := Exchange("udp", s.UDP, name, dns.TypeA)
	if err != nil {
		return err
	}
	want = slices.Sorted(slices.Values(want))
	if got := Addrs(r); !slices.Equal(got, want) {
		return fmt.Errorf("%s: rcode %s, addresses %v, want %v", name, dns.RcodeToString[r.Rcode], got, want)
	}
	return nil
}

// TestLargeCluster serves a cluster of 200 nodes: over UDP the answer holds
// what fits (512 octets without EDNS0, 1232 at most with it) with TC set; the
// TCP retry returns all 200.
func TestLargeCluster(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, `INSERT INTO pgcluster_nodes(cluster, name, address)
SELECT 'big', 'n' || i, ('192.0.2.0'::inet + i) FROM generate_series(1, 200) AS i`)
	s := StartCoreDNS(t, Corefile(pg.DSN("")))

	m := new(dns.Msg)
	m.SetQuestion("big."+Zone, dns.TypeA)
	udp := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
	r, _, err := udp.Exchange(m, s.UDP)
	if err != nil {
		t.Fatal(err)
	}
	r.Compress = true
	packed, _ := r.Pack()
	if !r.Truncated || len(r.Answer) >= 200 || len(packed) > dns.MinMsgSize {
		t.Errorf("UDP: TC %v, %d records, %d bytes; want TC, fewer than 200, at most 512 bytes", r.Truncated, len(r.Answer), len(packed))
	}
	t.Logf("UDP without EDNS: %d of 200 records in %d bytes, TC set", len(r.Answer), len(packed))
	tcp := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	r, _, err = tcp.Exchange(m, s.TCP)
	if err != nil {
		t.Fatal(err)
	}
	if r.Truncated || len(Addrs(r)) != 200 {
		t.Errorf("TCP: TC %v, %d addresses, want all 200", r.Truncated, len(Addrs(r)))
	}
	// A client that advertises a large buffer gets more over UDP, but never
	// a datagram over 1232 octets (DNS Flag Day 2020): TC still set.
	m.SetEdns0(dns.DefaultMsgSize*2, false)
	r, _, err = udp.Exchange(m, s.UDP)
	if err != nil {
		t.Fatal(err)
	}
	r.Compress = true
	packed, _ = r.Pack()
	if !r.Truncated || len(Addrs(r)) <= 40 || len(packed) > 1232 {
		t.Errorf("UDP with EDNS0 8192: TC %v, %d addresses in %d octets; want TC, more than without EDNS0, at most 1232 octets", r.Truncated, len(Addrs(r)), len(packed))
	}
	t.Logf("UDP with EDNS0 8192: %d of 200 records in %d octets, TC set", len(Addrs(r)), len(packed))
}
