package discovery

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
)

func TestLookupFunc(t *testing.T) {
	c := newCluster(t, 25*time.Millisecond, 2*time.Millisecond, 60*time.Millisecond)
	lookup := c.client(t, Config{}).LookupFunc()
	got, err := lookup(t.Context(), "prod.pgcluster.lan")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{c.nodes[1].Addr.String(), c.nodes[0].Addr.String(), c.nodes[2].Addr.String()}
	if !slices.Equal(got, want) {
		t.Errorf("LookupFunc = %v, want fastest first %v", got, want)
	}
	if got, _ := lookup(t.Context(), "127.0.0.7"); !slices.Equal(got, []string{"127.0.0.7"}) {
		t.Errorf("LookupFunc(ip) = %v", got)
	}
}

// pgconn connects to the fastest node, through the cluster's DNS only, and
// both attempts of sslmode=prefer share one resolution.
func TestConfigureConnConnectsToFastest(t *testing.T) {
	c := newCluster(t, 25*time.Millisecond, 2*time.Millisecond, 60*time.Millisecond)
	cl := c.client(t, Config{})
	before := c.dns.Queries()
	if _, err := cl.Resolve(t.Context(), "prod.pgcluster.lan"); err != nil {
		t.Fatal(err)
	}
	perResolve := c.dns.Queries() - before

	cfg, err := pgconn.ParseConfig("postgres://app@prod.pgcluster.lan/db?sslmode=prefer&connect_timeout=5")
	if err != nil {
		t.Fatal(err)
	}
	cl.ConfigureConn(cfg)
	before = c.dns.Queries()
	_, err = pgconn.ConnectConfig(t.Context(), cfg)
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "3D000" {
		t.Fatalf("connect: %v, want the stand-in's 3D000", err)
	}
	for i, pg := range c.pgs {
		want := int64(0)
		if i == 1 {
			want = 1
		}
		if pg.Startups() != want {
			t.Errorf("node %d got %d startup messages, want %d", i+1, pg.Startups(), want)
		}
	}
	if q := c.dns.Queries() - before; q != perResolve {
		t.Errorf("connect asked %d DNS queries, want one resolution's %d", q, perResolve)
	}
}

func TestConfigureConnPortWithoutSRV(t *testing.T) {
	pg := discoverytest.ServePostgres(t, discoverytest.Listen(t, "127.0.0.2:0"))
	s := discoverytest.NewServer(t, zone)
	s.SetRecords("plain 30 IN A 127.0.0.2")
	cl, _ := New(Config{Servers: []string{s.Addr}})
	port := strconv.Itoa(int(pg.Addr.Port()))
	cfg, err := pgconn.ParseConfig("postgres://app@plain.pgcluster.lan:" + port + "/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	cl.ConfigureConn(cfg)
	got, err := cfg.LookupFunc(t.Context(), cfg.Host)
	if err != nil || !slices.Equal(got, []string{pg.Addr.String()}) {
		t.Errorf("lookup = %v, %v; want the URL's port %s", got, err, port)
	}
}

func TestDialContext(t *testing.T) {
	c := newCluster(t, 25*time.Millisecond, 2*time.Millisecond)
	cl := c.client(t, Config{})
	conn, err := cl.DialContext(t.Context(), "tcp", "prod.pgcluster.lan:5432")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if got := conn.RemoteAddr().(*net.TCPAddr).AddrPort(); got != c.nodes[1].Addr {
		t.Errorf("dialled %s, want the fastest %s", got, c.nodes[1].Addr)
	}
	direct, err := cl.DialContext(t.Context(), "tcp", c.pgs[0].Addr.String())
	if err != nil {
		t.Fatal(err)
	}
	direct.Close()
	if _, err := cl.DialContext(t.Context(), "tcp", "nothing.pgcluster.lan:5432"); !errors.Is(err, ErrNoAddress) {
		t.Errorf("dial of an unknown name: %v, want ErrNoAddress", err)
	}
}

func TestClientConnect(t *testing.T) {
	c := newCluster(t, 0)
	_, err := c.client(t, Config{}).Connect(t.Context(), "postgres://app@local.pgcluster.lan/db?sslmode=disable")
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); !ok || pgErr.Code != "3D000" {
		t.Fatalf("Connect: %v, want the stand-in's 3D000", err)
	}
	if c.pgs[0].Startups() != 1 {
		t.Errorf("%d startups, want 1", c.pgs[0].Startups())
	}
}

func TestWatcherLookupFunc(t *testing.T) {
	c := newCluster(t, 25*time.Millisecond, 2*time.Millisecond)
	w, _ := watch(t, c.client(t, Config{}), "prod.pgcluster.lan", WatchOptions{MinInterval: MinWatchInterval})
	lookup := w.LookupFunc()
	before := c.dns.Queries()
	got, err := lookup(t.Context(), "PROD.pgcluster.lan")
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != c.nodes[1].Addr.String() {
		t.Errorf("lookup = %v, want the fastest first", got)
	}
	if q := c.dns.Queries() - before; q != 0 {
		t.Errorf("the watched name cost %d DNS queries, want none", q)
	}
	// Another name is resolved.
	if got, err := lookup(t.Context(), "local.pgcluster.lan"); err != nil || len(got) != 2 {
		t.Errorf("lookup of another name = %v, %v", got, err)
	}
	// A failed dial makes the Watcher resolve again.
	dial := w.DialFunc(nil)
	dead := discoverytest.NewPostgres(t)
	dead.Close()
	w.mu.Lock()
	started := w.started
	w.mu.Unlock()
	if _, err := dial(t.Context(), "tcp", dead.Addr.String()); err == nil {
		t.Fatal("dial of a closed port succeeded")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		n := w.started
		w.mu.Unlock()
		if n > started {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a failed dial did not make the Watcher resolve again")
		}
		time.Sleep(5 * time.Millisecond) // polling a condition, with a deadline
	}
	_ = netip.AddrPort{}
}
