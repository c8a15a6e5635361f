package pgcluster

import (
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// Values of cluster.replicas, and of state= in the TXT record of
// sync.<cluster>.
const (
	// replicasUnknown: no one primary whose check is up and read its
	// standbys (none, split brain, tcp checks).
	replicasUnknown = "unknown"
	// replicasHidden: the primary's check may not read pg_stat_replication's
	// columns; its role lacks pg_monitor.
	replicasHidden = "no_privilege"
	// replicasKnown: the primary listed its standbys.
	replicasKnown = "known"
)

// judgeReplicas finds each standby in the list of standbys the cluster's
// one primary reported (pg_stat_replication, read by its check): by
// application_name, which operators set to the node's name (or by
// cluster_name, which a walreceiver uses without one), else by the address
// its connection came from, where no other walsender came from it. Without
// exactly one serving primary whose check read the list, nothing is known.
func (c *cluster) judgeReplicas() {
	c.replicas = replicasUnknown
	defer func() {
		for _, m := range c.members {
			m.replicas = c.replicas
		}
	}()
	if len(c.primaries) != 1 {
		return
	}
	v := c.primaries[0].check
	switch {
	case v.State != health.Up:
		return
	case v.ReplicasHidden:
		c.replicas = replicasHidden
		return
	case v.Replicas == nil:
		return
	}
	c.replicas = replicasKnown
	byName := make(map[string]*health.Replica, len(v.Replicas))
	fromAddr := map[string]int{}
	for i := range v.Replicas {
		r := &v.Replicas[i]
		if _, dup := byName[r.Name]; dup {
			byName[r.Name] = nil // two walsenders of one name: neither is that node's
		} else {
			byName[r.Name] = r
		}
		if r.Addr.IsValid() {
			fromAddr[r.Addr.Unmap().String()]++
		}
	}
	for _, m := range c.members {
		if m.Role != roleStandby {
			continue
		}
		if r := byName[m.Name]; r != nil {
			m.replica = r
			continue
		}
		for i := range v.Replicas {
			r := &v.Replicas[i]
			if r.Addr.IsValid() && r.Addr.Unmap() == m.addr.Unmap() && fromAddr[m.addr.Unmap().String()] == 1 {
				m.replica = r
			}
		}
	}
}

// judgeReplayLag marks the standbys whose replay_lag, as the primary
// reports it, is over maxLag, and those it does not list (their lag is
// unknown): out of standby., prefer-standby. and sync. Without a known list
// of the primary's standbys, every standby's lag is unknown.
func (c *cluster) judgeReplayLag(maxLag time.Duration) {
	for _, m := range c.members {
		if m.Role != roleStandby {
			continue
		}
		m.lagging = m.serving && (m.replica == nil || m.replica.Lag > maxLag)
	}
}

// isSync reports whether m is a synchronous standby the primary vouches for.
func (m *member) isSync() bool {
	return m.replica != nil && m.replica.Sync == health.ReplicaSync
}
