package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// MasterName is the name the sentinels of StartSentinel monitor.
const MasterName = "pgcluster"

// Sentinel settings and limits of StartSentinel.
const (
	sentinels         = 3
	quorum            = 2
	downAfter         = time.Second
	failoverTimeout   = 5 * time.Second
	syncTimeout       = 30 * time.Second // until the group is in sync
	switchTimeout     = 30 * time.Second // until a failover has switched
	sentinelCallLimit = time.Second      // one call to a sentinel or server
)

// Sentinel is a Redis Sentinel group on loopback: a master, a replica of it
// and three sentinels monitoring it with a quorum of two.
type Sentinel struct {
	mu        sync.Mutex
	master    *Server
	replica   *Server
	sentinels []*Server
}

// StartSentinel starts a Sentinel group for the test and returns once every
// sentinel reports the master, knows the replica and the other sentinels,
// and the replica is in sync. Everything is stopped when the test ends,
// sentinels first. A group that cannot start fails the test.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	dir := t.TempDir()
	logw := testLog{t}
	g := &Sentinel{}
	t.Cleanup(g.stop)

	var err error
	g.master, err = startServer(filepath.Join(dir, "master"), logw, "master", serverArgs(filepath.Join(dir, "master"), "notice"))
	if err != nil {
		t.Fatalf("this test needs a real redis-server and could not start the Sentinel group's master: %v", err)
	}
	_, mport, _ := net.SplitHostPort(g.master.Addr())
	rdir := filepath.Join(dir, "replica")
	g.replica, err = startServer(rdir, logw, "replica", serverArgs(rdir, "notice",
		"--replicaof", "127.0.0.1", mport, "--replica-announce-ip", "127.0.0.1"))
	if err != nil {
		t.Fatalf("cannot start the Sentinel group's replica: %v", err)
	}
	for i := range sentinels {
		sdir := filepath.Join(dir, fmt.Sprintf("sentinel%d", i+1))
		s, err := startServer(sdir, logw, fmt.Sprintf("sentinel%d", i+1), sentinelArgs(sdir, mport))
		if err != nil {
			t.Fatalf("cannot start sentinel %d: %v", i+1, err)
		}
		g.mu.Lock()
		g.sentinels = append(g.sentinels, s)
		g.mu.Unlock()
	}
	g.WaitSynced(t)
	return g
}

// sentinelArgs returns the command line of a sentinel on a port: a
// sentinel.conf written for that port (sentinels rewrite their file).
func sentinelArgs(dir, masterPort string) func(int) ([]string, error) {
	return func(port int) ([]string, error) {
		conf := filepath.Join(dir, "sentinel.conf")
		text := strings.Join([]string{
			"port " + strconv.Itoa(port),
			"bind 127.0.0.1",
			"dir " + dir,
			"loglevel notice",
			"sentinel resolve-hostnames no",
			"sentinel announce-ip 127.0.0.1",
			fmt.Sprintf("sentinel monitor %s 127.0.0.1 %s %d", MasterName, masterPort, quorum),
			fmt.Sprintf("sentinel down-after-milliseconds %s %d", MasterName, downAfter.Milliseconds()),
			fmt.Sprintf("sentinel failover-timeout %s %d", MasterName, failoverTimeout.Milliseconds()),
		}, "\n") + "\n"
		if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
			return nil, fmt.Errorf("write %s: %w", conf, err)
		}
		return []string{conf, "--sentinel"}, nil
	}
}

// MasterName returns the name the sentinels monitor.
func (g *Sentinel) MasterName() string { return MasterName }

// URL returns the group as a redis-sentinel:// URL: the first sentinel as
// the host, the others as addr parameters, and the master's name.
func (g *Sentinel) URL() string {
	ss := g.Sentinels()
	var b strings.Builder
	b.WriteString("redis-sentinel://" + ss[0].Addr() + "?")
	for _, s := range ss[1:] {
		b.WriteString("addr=" + s.Addr() + "&")
	}
	b.WriteString("master_name=" + MasterName)
	return b.String()
}

// Master returns the master: the one started as master, or after Failover
// the replica it promoted.
func (g *Sentinel) Master() *Server {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.master
}

// Replica returns the replica: after Failover, the old master, which the
// sentinels turn into a replica of the new one within some seconds
// (WaitSynced waits for it).
func (g *Sentinel) Replica() *Server {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.replica
}

// Sentinels returns the three sentinel processes.
func (g *Sentinel) Sentinels() []*Server {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*Server(nil), g.sentinels...)
}

// Client returns a Sentinel-aware client of the master (go-redis's failover
// client, ContextTimeoutEnabled), closed when the test ends.
func (g *Sentinel) Client(t testing.TB) redis.UniversalClient {
	t.Helper()
	var addrs []string
	for _, s := range g.Sentinels() {
		addrs = append(addrs, s.Addr())
	}
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            MasterName,
		SentinelAddrs:         addrs,
		ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Failover makes the sentinels promote the replica (SENTINEL FAILOVER) and
// waits until every sentinel reports it as the master and it answers ROLE
// as master; then Master and Replica swap. The group is first brought in
// sync with WaitSynced, so that Failover can be called again.
func (g *Sentinel) Failover(t testing.TB) {
	t.Helper()
	g.WaitSynced(t)
	next := g.Replica()
	var asked error
	ok := waitFor(switchTimeout, func(ctx context.Context) error {
		// Any sentinel can run it; one that refuses (a failover still in
		// progress, a replica it deems not good yet) is asked again.
		for _, s := range g.Sentinels() {
			if asked = withSentinel(s, func(sc *redis.SentinelClient) error {
				return sc.Failover(ctx, MasterName).Err()
			}); asked == nil {
				return nil
			}
		}
		return asked
	})
	if !ok {
		t.Fatalf("no sentinel accepted SENTINEL FAILOVER %s within %v: %v", MasterName, switchTimeout, asked)
	}
	var last error
	if !waitFor(switchTimeout, func(ctx context.Context) error {
		last = g.reportsMaster(ctx, next)
		return last
	}) {
		t.Fatalf("failover did not switch the master to %s within %v: %v", next.Addr(), switchTimeout, last)
	}
	g.mu.Lock()
	g.master, g.replica = g.replica, g.master
	g.mu.Unlock()
}

// WaitSynced waits until every sentinel reports Master as the master, sees
// it up, knows Replica and the two other sentinels, and Replica is a
// replica of Master with its link up. It fails the test after 30 s.
func (g *Sentinel) WaitSynced(t testing.TB) {
	t.Helper()
	var last error
	if !waitFor(syncTimeout, func(ctx context.Context) error {
		last = g.synced(ctx)
		return last
	}) {
		t.Fatalf("the Sentinel group is not in sync after %v: %v", syncTimeout, last)
	}
}

func (g *Sentinel) synced(ctx context.Context) error {
	m, r := g.Master(), g.Replica()
	if err := g.reportsMaster(ctx, m); err != nil {
		return err
	}
	for i, s := range g.Sentinels() {
		err := withSentinel(s, func(sc *redis.SentinelClient) error {
			info, err := sc.Master(ctx, MasterName).Result()
			if err != nil {
				return err
			}
			if info["flags"] != "master" {
				return fmt.Errorf("flags of the master are %q", info["flags"])
			}
			if want := strconv.Itoa(sentinels - 1); info["num-other-sentinels"] != want {
				return fmt.Errorf("knows %s other sentinels, want %s", info["num-other-sentinels"], want)
			}
			reps, err := sc.Replicas(ctx, MasterName).Result()
			if err != nil {
				return err
			}
			for _, rep := range reps {
				if rep["name"] == r.Addr() {
					if rep["flags"] != "slave" || rep["master-link-status"] != "ok" {
						return fmt.Errorf("replica %s has flags %q, master link %q", r.Addr(), rep["flags"], rep["master-link-status"])
					}
					return nil
				}
			}
			return fmt.Errorf("does not know the replica %s yet", r.Addr())
		})
		if err != nil {
			return fmt.Errorf("sentinel %d (%s): %w", i+1, s.Addr(), err)
		}
	}
	_, mport, _ := net.SplitHostPort(m.Addr())
	info, err := call(r, func(c *redis.Client) (string, error) { return c.Info(ctx, "replication").Result() })
	if err != nil {
		return fmt.Errorf("INFO replication of the replica %s: %w", r.Addr(), err)
	}
	for _, want := range []string{"role:slave", "master_port:" + mport, "master_link_status:up"} {
		if !strings.Contains(info, want+"\r\n") {
			return fmt.Errorf("the replica %s is not in sync with %s (no %q in INFO replication):\n%s", r.Addr(), m.Addr(), want, info)
		}
	}
	return nil
}

// reportsMaster checks that every sentinel reports m as the master and that
// m answers ROLE as a master.
func (g *Sentinel) reportsMaster(ctx context.Context, m *Server) error {
	for i, s := range g.Sentinels() {
		err := withSentinel(s, func(sc *redis.SentinelClient) error {
			a, err := sc.GetMasterAddrByName(ctx, MasterName).Result()
			if err != nil {
				return err
			}
			if len(a) != 2 || net.JoinHostPort(a[0], a[1]) != m.Addr() {
				return fmt.Errorf("reports master %v, want %s", a, m.Addr())
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("sentinel %d (%s): %w", i+1, s.Addr(), err)
		}
	}
	role, err := call(m, func(c *redis.Client) ([]any, error) { return c.Do(ctx, "ROLE").Slice() })
	if err != nil {
		return fmt.Errorf("ROLE of %s: %w", m.Addr(), err)
	}
	if len(role) == 0 || role[0] != "master" {
		return fmt.Errorf("%s answers ROLE %v, want master", m.Addr(), role)
	}
	return nil
}

// stop stops the sentinels first, so that they start no failover while the
// servers go, then the replica and the master.
func (g *Sentinel) stop() {
	for _, s := range g.Sentinels() {
		s.Stop()
	}
	for _, s := range []*Server{g.Replica(), g.Master()} {
		if s != nil {
			s.Stop()
		}
	}
}

// withSentinel runs f with a short-lived client of sentinel s.
func withSentinel(s *Server, f func(*redis.SentinelClient) error) error {
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: sentinelCallLimit, ContextTimeoutEnabled: true})
	defer sc.Close()
	return f(sc)
}

// call runs f with a short-lived client of server s.
func call[T any](s *Server, f func(*redis.Client) (T, error)) (T, error) {
	c := s.client()
	defer c.Close()
	return f(c)
}

// waitFor polls cond until it returns nil (true) or timeout passes (false).
// Each poll gets a context long enough to ask every process of the group.
func waitFor(timeout time.Duration, cond func(context.Context) error) bool {
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), (sentinels+2)*sentinelCallLimit)
		err := cond(ctx)
		cancel()
		if err == nil {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}
