package discovery

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
)

func TestResolveSRV(t *testing.T) {
	c := newCluster(t, 0, 0, 0)
	cl := c.client(t, Config{})
	for _, name := range []string{"local.pgcluster.lan", "local.pgcluster.lan.", "prod.pgcluster.lan", "LOCAL.PgCluster.lan"} {
		ans, err := cl.Resolve(t.Context(), name)
		if err != nil {
			t.Fatalf("Resolve(%s): %v", name, err)
		}
		if !ans.SRV {
			t.Errorf("Resolve(%s): ports not from SRV", name)
		}
		if got, want := addrs(ans.Candidates), nodeAddrs(c.nodes...); !slices.Equal(got, want) {
			t.Errorf("Resolve(%s) = %v, want %v", name, got, want)
		}
		if ans.Candidates[0].Host != "n1.local.pgcluster.lan." {
			t.Errorf("host %q, want the SRV target", ans.Candidates[0].Host)
		}
		if ans.TTL != 30*time.Second {
			t.Errorf("TTL %s, want 30s", ans.TTL)
		}
	}
	ans, _ := cl.Resolve(t.Context(), "prod.pgcluster.lan")
	if ans.Canonical != "local.pgcluster.lan." {
		t.Errorf("canonical %q, want local.pgcluster.lan.", ans.Canonical)
	}
}

func TestResolvePrimaryThroughAlias(t *testing.T) {
	c := newCluster(t, 0, 0, 0)
	cl := c.client(t, Config{})
	ans, err := cl.Resolve(t.Context(), "primary.prod.pgcluster.lan")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := addrs(ans.Candidates), nodeAddrs(c.nodes[0]); !slices.Equal(got, want) {
		t.Errorf("primary = %v, want %v", got, want)
	}
	if ans.Canonical != "primary.local.pgcluster.lan." {
		t.Errorf("canonical %q", ans.Canonical)
	}
}

func TestResolveFollowsCNAMEAcrossQueries(t *testing.T) {
	c := newCluster(t, 0, 0)
	c.dns.SetChase(false) // CNAME answers carry only the CNAME
	c.dns.SetRecords("a 30 IN CNAME b", "b 30 IN CNAME prod")
	cl := c.client(t, Config{})
	ans, err := cl.Resolve(t.Context(), "a.pgcluster.lan")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := addrs(ans.Candidates), nodeAddrs(c.nodes...); !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if ans.Canonical != "local.pgcluster.lan." {
		t.Errorf("canonical %q", ans.Canonical)
	}
}

func TestResolveCNAMELoop(t *testing.T) {
	c := newCluster(t)
	c.dns.SetRecords("a 30 IN CNAME b", "b 30 IN CNAME a")
	cl := c.client(t, Config{})
	if _, err := cl.Resolve(t.Context(), "a.pgcluster.lan"); err == nil || errors.Is(err, ErrNoAddress) {
		t.Fatalf("Resolve of a CNAME loop: %v, want a chain error", err)
	}
}

func TestResolveWithoutSRV(t *testing.T) {
	lns := discoverytest.ListenSamePort(t, "127.0.0.2", "127.0.0.3")
	port := lns[0].Addr().(*net.TCPAddr).AddrPort().Port()
	for _, ln := range lns {
		discoverytest.ServePostgres(t, ln)
	}
	s := discoverytest.NewServer(t, zone)
	s.SetTTL(7)
	s.SetRecords("plain 20 IN A 127.0.0.2", "plain 20 IN A 127.0.0.3", "plain 20 IN AAAA ::1")
	want := func(p uint16) []netip.AddrPort {
		return []netip.AddrPort{
			netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), p),
			netip.AddrPortFrom(netip.MustParseAddr("127.0.0.3"), p),
			netip.AddrPortFrom(netip.IPv6Loopback(), p),
		}
	}

	cl, _ := New(Config{Servers: []string{s.Addr}})
	ans, err := cl.Resolve(t.Context(), "plain.pgcluster.lan")
	if err != nil {
		t.Fatal(err)
	}
	if ans.SRV || !slices.Equal(addrs(ans.Candidates), want(DefaultPort)) {
		t.Errorf("without SRV: %v (srv %v), want %v", addrs(ans.Candidates), ans.SRV, want(DefaultPort))
	}
	if ans.TTL != 20*time.Second {
		t.Errorf("TTL %s, want 20s", ans.TTL)
	}

	cl, _ = New(Config{Servers: []string{s.Addr}, DefaultPort: port})
	ans, _ = cl.Resolve(t.Context(), "plain.pgcluster.lan")
	if !slices.Equal(addrs(ans.Candidates), want(port)) {
		t.Errorf("DefaultPort %d: %v", port, addrs(ans.Candidates))
	}
	// Both IPv4 nodes answer the probe; nobody listens on [::1]:port.
	res, err := cl.Discover(t.Context(), "plain.pgcluster.lan")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(res.Ranking.Reachable()); got != 2 {
		t.Errorf("%d reachable, want 2: %v", got, res.Ranking)
	}

	// A fixed port wins over SRV records, which are not even asked for.
	c := newCluster(t, 0)
	cl = c.client(t, Config{Port: port})
	ans, _ = cl.Resolve(t.Context(), "local.pgcluster.lan")
	if ans.SRV || ans.Candidates[0].Addr.Port() != port {
		t.Errorf("Port %d: %v", port, ans.Candidates)
	}
}

// A name with no address says whether it does not exist (NXDOMAIN) or
// exists without an address (NODATA), through an alias too.
func TestResolveNoAddress(t *testing.T) {
	c := newCluster(t, 0)
	c.dns.SetTTL(3)
	c.dns.SetAlias("gone", "removed")
	cl := c.client(t, Config{})
	tests := []struct {
		name string
		why  error
		text string
	}{
		{"nothing.pgcluster.lan", ErrNoSuchName, "no address for nothing.pgcluster.lan.: no such name (NXDOMAIN)"},
		{"gone.pgcluster.lan", ErrNoSuchName, "alias of removed.pgcluster.lan.): no such name (NXDOMAIN)"},
		{"standby.local.pgcluster.lan", ErrNoData, "no address for standby.local.pgcluster.lan.: name exists but has no address"},
		{"standby.prod.pgcluster.lan", ErrNoData, "name exists but has no address"},
	}
	for _, tc := range tests {
		ans, err := cl.Resolve(t.Context(), tc.name)
		if !errors.Is(err, ErrNoAddress) || !errors.Is(err, tc.why) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("Resolve(%s): %v; want ErrNoAddress and %v, saying %q", tc.name, err, tc.why, tc.text)
		}
		if ans.TTL != 3*time.Second {
			t.Errorf("Resolve(%s): TTL %s, want the negative TTL 3s", tc.name, ans.TTL)
		}
	}
}

func TestResolveIPLiteral(t *testing.T) {
	cl, _ := New(Config{Servers: []string{"127.0.0.1:1"}})
	ans, err := cl.Resolve(t.Context(), "127.0.0.9")
	if err != nil || len(ans.Candidates) != 1 || ans.Candidates[0].Addr != netip.MustParseAddrPort("127.0.0.9:5432") {
		t.Errorf("Resolve(ip) = %v, %v", ans.Candidates, err)
	}
}

func TestResolveDNSDown(t *testing.T) {
	c := newCluster(t, 0)
	cl := c.client(t, Config{DNSTimeout: 100 * time.Millisecond})
	c.dns.SetSilent(true)
	if _, err := cl.Resolve(t.Context(), "local.pgcluster.lan"); err == nil || errors.Is(err, ErrNoAddress) {
		t.Fatalf("Resolve with DNS down: %v, want a query error", err)
	}
}
