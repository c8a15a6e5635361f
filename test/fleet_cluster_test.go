package test

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// statusNodes returns, for each backend, which node of the cluster stores
// its status (-1: none does).
func (f *fleet) statusNodes(t testing.TB, c *redistest.Cluster) []int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := make([]int, len(f.backends))
	for i := range f.backends {
		out[i] = -1
		key := fleetPrefix + "{local/n" + strconv.Itoa(i) + "}:status"
		for k, n := range c.Nodes() {
			// A node that does not serve the key's slot answers MOVED.
			if found, err := n.Client(t).Exists(ctx, key).Result(); err == nil && found == 1 {
				out[i] = k
			}
		}
	}
	return out
}

// A fleet of three bin/coredns processes on a Redis Cluster of three
// masters, given as a redis-cluster:// URL: the leases and statuses spread
// over the masters, each backend is probed by one instance, a flip reaches
// all three, and an instance started while a backend is down, which reads
// the statuses from every master, never answers it.
func TestFleetRedisCluster(t *testing.T) {
	const interval, timeout = 200 * time.Millisecond, 100 * time.Millisecond
	rc := redistest.StartCluster(t)
	f := newFleet(t, fleetOptions{interval: interval, timeout: timeout, backends: 6, extra: []string{"redis_prefix " + fleetPrefix}})
	corefile := f.corefile(rc.URL())
	ins := startInstances(t, corefile, 3)
	Eventually(t, 20*time.Second, coordinated(t, ins, len(f.backends)))
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts()))
	// The statuses are on every master: a resync must read them all.
	where := f.statusNodes(t, rc)
	t.Logf("the node storing each backend's status: %v", where)
	nodes := map[int]bool{}
	for i, k := range where {
		if k < 0 {
			t.Fatalf("no node of the cluster stores the status of backend %d", i)
		}
		nodes[k] = true
	}
	if len(nodes) != len(rc.Nodes()) {
		t.Fatalf("the statuses are on nodes %v only: the test does not cover statuses spread over every master", where)
	}

	f.onePerBackend(t, 2*time.Second, "Redis Cluster")
	Eventually(t, 5*time.Second, coordinated(t, ins, len(f.backends)))
	for k, in := range ins {
		t.Logf("Redis Cluster: instance %d holds %v leases", k, metric(t, in, leasesMetric))
	}

	down := f.dropTimes(t, ins, 0, true)
	up := f.dropTimes(t, ins, 0, false)
	t.Logf("Redis Cluster: flip spread between instances: down %v, up %v", spread(down), spread(up))
	for what, times := range map[string][]time.Time{"down": down, "up": up} {
		if s := spread(times); s > time.Second {
			t.Errorf("backend 0 going %s reached the last instance %v after the first: the published status did not reach every instance", what, s.Round(time.Millisecond))
		}
	}

	// Cold start: one backend per master down while a fourth instance
	// starts, which must read the statuses from every master.
	var off []int
	seen := map[int]bool{}
	for i, k := range where {
		if !seen[k] {
			seen[k] = true
			off = append(off, i)
		}
	}
	for _, i := range off {
		f.backends[i].Close()
	}
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts(off...)))
	in := StartFleetInstanceNoWait(t, corefile)
	n := 0
	for _, i := range off {
		n += neverAnswers(t, in, f.backends[i].host)
	}
	t.Logf("the late instance's %d answers held none of backends %v, down and stored on nodes %v", n, off, slices.Sorted(maps.Keys(seen)))
	ins = append(ins, in)
	for _, i := range off {
		f.backends[i].Open(t)
	}
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts()))
	Eventually(t, 20*time.Second, coordinated(t, ins, len(f.backends)))
	for k, in := range ins {
		ok := metric(t, in, `coredns_pgcluster_redis_resyncs_total{result="ok",zone="`+Zone+`"}`)
		failed := metric(t, in, `coredns_pgcluster_redis_resyncs_total{result="error",zone="`+Zone+`"}`)
		if ok == 0 || failed > 0 {
			t.Errorf("instance %d: %v resyncs of every status complete, %v failed", k, ok, failed)
		}
	}
}
