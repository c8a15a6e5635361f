package discovery

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// The primary stops and a standby is promoted, while the zone holds the old
// primary (state=held), as pgcluster does until its checks see the new one.
// The pool keeps one session to each serving node during the fallback and
// asks each whether it takes writes: it does not open a connection per
// write attempt to nodes still in recovery, its first commit on the
// promoted standby comes soon after that leaves recovery, and the
// fallback's sessions close once DNS names the primary. A pgxpool on
// libpq's multi-host string with target_session_attrs=read-write writes
// beside it, for the figures.
func TestPoolWritesOnPromotedStandby(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode string // pg_ctl stop's mode
		wait bool   // promote once the stop has ended and the writes have failed a while
	}{
		{"planned", "fast", false},
		{"unplanned", "immediate", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := realServer(t, "127.0.0.2")
			s1 := pgtest.NewStandby(t, old, pgtest.Options{Host: "127.0.0.3"})
			s2 := pgtest.NewStandby(t, old, pgtest.Options{Host: "127.0.0.4"})
			on, n2, n3 := nodeOf("n1", old, "primary"), nodeOf("n2", s1, "standby"), nodeOf("n3", s2, "standby")
			dns := discoverytest.NewServer(t, zone)
			dns.SetTTL(5)
			dns.SetCluster("local", on, n2, n3)

			dials := &dialCounter{}
			pool := countingWriterPool(t, dns, dials)
			w := startWriter(t, pool, 2, writePeriod)
			mh := startWriter(t, multiHostPool(t, old, s1, s2), 2, writePeriod)
			start := time.Now()
			waitFor(t, 10*time.Second, "both writers commit on the primary", func() bool {
				_, a := w.firstOn(on.Addr, start)
				_, b := mh.firstOn(on.Addr, start)
				return a && b
			})

			// The fleet takes the old primary out within milliseconds of its
			// sessions ending, and holds it in primary.'s answer.
			stopped := time.Now()
			stop := make(chan error, 1)
			go func() { stop <- old.StopMode(tc.mode) }()
			dns.SetCluster("local", n2, n3)
			dns.HoldPrimary("local", on)
			if tc.wait {
				if err := <-stop; err != nil {
					t.Fatal(err)
				}
				held := waitState(t, pool, PrimaryHeld)
				// The fallback's sessions open, then both standbys, in
				// recovery, are watched for half a second.
				waitFor(t, 10*time.Second, "the fallback settles", func() bool { return time.Since(held) >= 250*time.Millisecond })
				d2, d3, from := dials.count(n2.Addr), dials.count(n3.Addr), time.Now()
				_, a0 := w.snapshot()
				waitFor(t, 10*time.Second, "half a second of failing writes", func() bool { return time.Since(from) >= 500*time.Millisecond })
				el := time.Since(from)
				d2, d3 = dials.count(n2.Addr)-d2, dials.count(n3.Addr)-d3
				_, a1 := w.snapshot()
				t.Logf("held, both standbys in recovery: %d and %d connections to them in %s (%d write attempts)", d2, d3, el.Round(time.Millisecond), a1-a0)
				if d2 > 1 || d3 > 1 {
					t.Errorf("%d and %d connections to the standbys in %s while neither took writes, want at most 1 each (a session each, kept open)", d2, d3, el.Round(time.Millisecond))
				}
			}

			promoting := time.Now()
			if err := s2.Promote(); err != nil {
				t.Fatal(err)
			}
			promoted := time.Now()
			c := waitForCommit(t, w, n3, promoting)
			m := waitForCommit(t, mh, n3, promoting)
			t.Logf("first commit on the promoted standby after pg_ctl promote -w returned (it took %s, %s after the stop began): pool %s, multi-host string %s",
				promoted.Sub(promoting).Round(time.Millisecond), promoting.Sub(stopped).Round(time.Millisecond),
				c.done.Sub(promoted).Round(time.Millisecond), m.done.Sub(promoted).Round(time.Millisecond))
			if d := c.done.Sub(promoted); d > 3*time.Second {
				t.Errorf("the pool's first commit on the promoted standby came %s after the promotion, want well under 3s", d)
			}
			if !tc.wait {
				if err := <-stop; err != nil {
					t.Fatal(err)
				}
			}

			n3.Role = "primary"
			dns.SetCluster("local", n2, n3)
			dns.ReleasePrimary("local")
			waitState(t, pool, PrimaryServing)
			waitFor(t, 10*time.Second, "no session of the pool on the standby", func() bool {
				return sessionsOf(t, s1, poolApp) == 0
			})
		})
	}
}

// poolApp is the application_name of countingWriterPool's connections.
const poolApp = "discovery-writer"

// countingWriterPool opens a pool for primary.local, as writerPool does,
// whose every dial is counted by dials.
func countingWriterPool(t *testing.T, dns *discoverytest.Server, dials *dialCounter) *Pool {
	t.Helper()
	cl, err := New(Config{Servers: []string{dns.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := pgxpool.ParseConfig("postgres://postgres@primary.local.pgcluster.lan/postgres?sslmode=disable&connect_timeout=2&application_name=" + poolApp)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.DialFunc = dials.dial
	pool, err := cl.NewPoolWithConfig(t.Context(), cfg, WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// multiHostPool opens a pgxpool on libpq's multi-host string over ps with
// target_session_attrs=read-write.
func multiHostPool(t *testing.T, ps ...*pgtest.Postgres) *pgxpool.Pool {
	t.Helper()
	var hosts, ports []string
	for _, p := range ps {
		h, port, _ := net.SplitHostPort(p.HostPort())
		hosts, ports = append(hosts, h), append(ports, port)
	}
	pool, err := pgxpool.New(t.Context(), fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write connect_timeout=2",
		strings.Join(hosts, ","), strings.Join(ports, ",")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// sessionsOf counts p's sessions of application app (a name without
// quotes).
func sessionsOf(t *testing.T, p *pgtest.Postgres, app string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	var n int
	if err := p.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM pg_stat_activity WHERE application_name = '%s'", app), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// dialCounter is a DialFunc that counts the dials to each address.
type dialCounter struct {
	mu sync.Mutex
	n  map[netip.AddrPort]int
}

func (d *dialCounter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		d.mu.Lock()
		if d.n == nil {
			d.n = make(map[netip.AddrPort]int)
		}
		d.n[netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())]++
		d.mu.Unlock()
	}
	var nd net.Dialer
	return nd.DialContext(ctx, network, addr)
}

func (d *dialCounter) count(a netip.AddrPort) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[a]
}
