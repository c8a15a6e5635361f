package redistest

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// Settings and limits of StartCluster.
const (
	clusterMasters = 3
	clusterSlots   = 16384
	// clusterNodeTimeout is how long a node may not answer its peers
	// before they deem it failing.
	clusterNodeTimeout = 5 * time.Second
	// clusterTimeout bounds the wait until every node reports the cluster ok.
	clusterTimeout = 30 * time.Second
)

// Cluster is a Redis Cluster on loopback: three masters, no replicas, the
// 16384 slots split evenly between them.
type Cluster struct {
	nodes []*Server
	buses []int // each node's cluster bus port
}

// StartCluster starts a Redis Cluster for the test and returns once every
// node reports cluster_state:ok and knows the two others. Everything is
// stopped when the test ends. A cluster that cannot start fails the test.
//
// A node's cluster bus is on a free port of its own (cluster-port, Redis 7),
// not on its port + 10000, which may be above 65535 or taken.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	dir := t.TempDir()
	c := &Cluster{}
	t.Cleanup(c.stop)
	for i := range clusterMasters {
		name := fmt.Sprintf("node%d", i+1)
		ndir := filepath.Join(dir, name)
		bus := new(int)
		s, err := startServer(ndir, testLog{t}, name, clusterArgs(ndir, bus))
		if err != nil {
			t.Fatalf("this test needs a real redis-server and could not start Redis Cluster node %d: %v", i+1, err)
		}
		c.nodes = append(c.nodes, s)
		c.buses = append(c.buses, *bus)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := c.create(ctx); err != nil {
		t.Fatalf("cannot make a Redis Cluster of %s: %v", strings.Join(c.addrs(), ", "), err)
	}
	var last error
	if !waitFor(clusterTimeout, func(ctx context.Context) error {
		last = c.ready(ctx)
		return last
	}) {
		t.Fatalf("the Redis Cluster %s is not ok after %v: %v", strings.Join(c.addrs(), ", "), clusterTimeout, last)
	}
	return c
}

// clusterArgs returns the command line of a cluster node on a port, its
// nodes.conf in dir. The bus port is drawn for each new port (and kept,
// in *bus, for a restart on the same one).
func clusterArgs(dir string, bus *int) func(int) ([]string, error) {
	base := serverArgs(dir, "notice")
	last := 0
	return func(port int) ([]string, error) {
		if port != last {
			b, err := proc.FreePort()
			for err == nil && b == port {
				b, err = proc.FreePort()
			}
			if err != nil {
				return nil, err
			}
			last, *bus = port, b
		}
		args, err := base(port)
		if err != nil {
			return nil, err
		}
		return append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-port", strconv.Itoa(*bus),
			"--cluster-node-timeout", strconv.FormatInt(clusterNodeTimeout.Milliseconds(), 10),
		), nil
	}
}

// create gives each node its share of the slots and a distinct config
// epoch, then has the first node meet the others, as redis-cli --cluster
// create does.
func (c *Cluster) create(ctx context.Context) error {
	for i, n := range c.nodes {
		lo, hi := i*clusterSlots/len(c.nodes), (i+1)*clusterSlots/len(c.nodes)-1
		_, err := call(n, func(rc *redis.Client) (string, error) {
			if err := rc.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
				return "", fmt.Errorf("CLUSTER ADDSLOTSRANGE %d %d: %w", lo, hi, err)
			}
			if err := rc.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
				return "", fmt.Errorf("CLUSTER SET-CONFIG-EPOCH %d: %w", i+1, err)
			}
			return "", nil
		})
		if err != nil {
			return fmt.Errorf("node %s: %w", n.Addr(), err)
		}
	}
	for i, n := range c.nodes[1:] {
		host, port, _ := net.SplitHostPort(n.Addr())
		_, err := call(c.nodes[0], func(rc *redis.Client) (string, error) {
			return rc.Do(ctx, "CLUSTER", "MEET", host, port, c.buses[i+1]).Text()
		})
		if err != nil {
			return fmt.Errorf("CLUSTER MEET %s (bus %d) on %s: %w", n.Addr(), c.buses[i+1], c.nodes[0].Addr(), err)
		}
	}
	return nil
}

// ready checks that every node reports the cluster ok, with every slot
// served, and knows all the nodes.
func (c *Cluster) ready(ctx context.Context) error {
	for _, n := range c.nodes {
		info, err := call(n, func(rc *redis.Client) (string, error) { return rc.ClusterInfo(ctx).Result() })
		if err != nil {
			return fmt.Errorf("CLUSTER INFO of %s: %w", n.Addr(), err)
		}
		for _, want := range []string{
			"cluster_state:ok",
			"cluster_slots_ok:" + strconv.Itoa(clusterSlots),
			"cluster_known_nodes:" + strconv.Itoa(len(c.nodes)),
			"cluster_size:" + strconv.Itoa(len(c.nodes)),
		} {
			if !strings.Contains(info, want+"\r\n") {
				return fmt.Errorf("%s has no %q in CLUSTER INFO:\n%s", n.Addr(), want, info)
			}
		}
	}
	return nil
}

// URL returns the cluster as a redis-cluster:// URL: the first node as the
// host, the others as addr parameters.
func (c *Cluster) URL() string {
	addrs := c.addrs()
	return "redis-cluster://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
}

// Nodes returns the three masters, in the order of their slots.
func (c *Cluster) Nodes() []*Server { return append([]*Server(nil), c.nodes...) }

// Client returns a cluster client of the nodes (ContextTimeoutEnabled),
// closed when the test ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rc.Close() })
	return rc
}

func (c *Cluster) addrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.Addr())
	}
	return out
}

func (c *Cluster) stop() {
	for _, n := range c.nodes {
		n.Stop()
	}
}
