package discovery

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
)

const zone = "pgcluster.lan."

// cluster is a DNS server publishing one cluster, "local", of stand-in
// PostgreSQL nodes, each behind a proxy adding the given delay (none when
// zero), with the alias "prod" pointing at it.
type cluster struct {
	dns   *discoverytest.Server
	pgs   []*discoverytest.Postgres
	nodes []discoverytest.Node
}

func newCluster(t testing.TB, delays ...time.Duration) *cluster {
	t.Helper()
	c := &cluster{dns: discoverytest.NewServer(t, zone)}
	for i, d := range delays {
		pg := discoverytest.NewPostgres(t)
		addr := pg.Addr
		if d > 0 {
			addr = discoverytest.NewProxy(t, pg.Addr.String(), d).Addr
		}
		role := "standby"
		if i == 0 {
			role = "primary"
		}
		c.pgs = append(c.pgs, pg)
		c.nodes = append(c.nodes, discoverytest.Node{Name: fmt.Sprintf("n%d", i+1), Addr: addr, Role: role})
	}
	c.publish()
	c.dns.SetAlias("prod", "local")
	return c
}

func (c *cluster) publish() { c.dns.SetCluster("local", c.nodes...) }

// client returns a Client asking the cluster's DNS server.
func (c *cluster) client(t testing.TB, cfg Config) *Client {
	t.Helper()
	cfg.Servers = append(cfg.Servers, c.dns.Addr)
	cl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func addrs(cs []Candidate) []netip.AddrPort {
	out := make([]netip.AddrPort, len(cs))
	for i, c := range cs {
		out[i] = c.Addr
	}
	return out
}

func nodeAddrs(ns ...discoverytest.Node) []netip.AddrPort {
	out := make([]netip.AddrPort, len(ns))
	for i, n := range ns {
		out[i] = n.Addr
	}
	return out
}

// events collects a Watcher's events for a test to wait on.
type events chan Event

func newEvents() events { return make(events, 1024) }

func (e events) on(ev Event) { e <- ev }

// await returns the first event matching want, failing the test after
// timeout; other events are skipped.
func (e events) await(t testing.TB, timeout time.Duration, want func(Event) bool) (Event, time.Duration) {
	t.Helper()
	start := time.Now()
	deadline := time.After(timeout)
	for {
		select {
		case ev := <-e:
			if want(ev) {
				return ev, time.Since(start)
			}
		case <-deadline:
			t.Fatalf("no matching event within %s", timeout)
		}
	}
}

func isEvent(kind EventKind, addr netip.AddrPort, primary bool) func(Event) bool {
	return func(e Event) bool { return e.Kind == kind && e.Candidate.Addr == addr && e.Primary == primary }
}

func splitHostPort(s string) (string, string, error) { return net.SplitHostPort(s) }
