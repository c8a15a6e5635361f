package redistest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A cluster of three masters serves every slot, each master a third of
// them; keys written through the cluster client spread over the three, a
// node asked for a key of another's slot answers MOVED, and a message
// published on one node reaches a subscriber on another.
func TestCluster(t *testing.T) {
	c := StartCluster(t)
	nodes := c.Nodes()
	if len(nodes) != 3 {
		t.Fatalf("%d nodes, want 3", len(nodes))
	}
	want := fmt.Sprintf("redis-cluster://%s?addr=%s&addr=%s", nodes[0].Addr(), nodes[1].Addr(), nodes[2].Addr())
	if c.URL() != want {
		t.Errorf("URL() = %q, want %q", c.URL(), want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Every slot is served, each node a third of them.
	slots, err := nodes[1].Client(t).ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]int{}
	for _, s := range slots {
		if len(s.Nodes) != 1 {
			t.Errorf("slots %d-%d have %d nodes, want one master and no replica", s.Start, s.End, len(s.Nodes))
		}
		served[s.Nodes[0].Addr] += int(s.End - s.Start + 1)
	}
	total := 0
	for _, n := range nodes {
		if got := served[n.Addr()]; got < clusterSlots/3 || got > clusterSlots/3+1 {
			t.Errorf("%s serves %d slots, want a third of %d", n.Addr(), got, clusterSlots)
		}
		total += served[n.Addr()]
	}
	if total != clusterSlots {
		t.Errorf("%d slots served, want %d", total, clusterSlots)
	}

	// Keys spread over the three masters.
	cc := c.Client(t)
	const keys = 300
	for i := range keys {
		if err := cc.Set(ctx, fmt.Sprintf("k%d", i), i, 0).Err(); err != nil {
			t.Fatalf("SET through the cluster client: %v", err)
		}
	}
	sum := int64(0)
	for _, n := range nodes {
		size, err := n.Client(t).DBSize(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if size == 0 {
			t.Errorf("%s holds no key of %d", n.Addr(), keys)
		}
		sum += size
	}
	if sum != keys {
		t.Errorf("the nodes hold %d keys, want %d", sum, keys)
	}

	// A node redirects a key it does not serve.
	slot, err := cc.ClusterKeySlot(ctx, "k0").Result()
	if err != nil {
		t.Fatal(err)
	}
	var other *Server
	for _, s := range slots {
		if int(slot) < s.Start || int(slot) > s.End {
			other = nodes[slices.IndexFunc(nodes, func(n *Server) bool { return n.Addr() == s.Nodes[0].Addr })]
			break
		}
	}
	if err := other.Client(t).Get(ctx, "k0").Err(); err == nil || !strings.HasPrefix(err.Error(), "MOVED") {
		t.Errorf("GET k0 (slot %d) on %s, which does not serve it: %v, want MOVED", slot, other.Addr(), err)
	}

	// Pub/Sub is cluster-wide: published on the third node, received on
	// the first.
	ps := nodes[0].Client(t).Subscribe(ctx, "news")
	defer ps.Close()
	if _, err := ps.ReceiveTimeout(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := nodes[2].Client(t).Publish(ctx, "news", "hello").Err(); err != nil {
		t.Fatal(err)
	}
	m, err := ps.ReceiveTimeout(ctx, 5*time.Second)
	if err != nil {
		t.Fatalf("a message published on %s did not reach a subscriber on %s: %v", nodes[2].Addr(), nodes[0].Addr(), err)
	}
	if msg, ok := m.(*redis.Message); !ok || msg.Payload != "hello" {
		t.Errorf("received %v, want the message hello", m)
	}
}

// Every node is gone once the test that started the cluster has ended.
func TestClusterCleanup(t *testing.T) {
	var pids []int
	t.Run("cluster", func(t *testing.T) {
		for _, n := range StartCluster(t).Nodes() {
			pids = append(pids, n.Pid())
		}
	})
	if len(pids) != 3 {
		t.Fatalf("%d nodes started, want 3", len(pids))
	}
	for _, pid := range pids {
		if pid == 0 || !gone(pid) {
			t.Errorf("cluster node %d is still there after the test's cleanup", pid)
		}
	}
}
