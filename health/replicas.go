package health

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"time"
)

// Replica is a standby as its primary sees it in pg_stat_replication: what
// tells a synchronous standby from an asynchronous one, and how far behind
// each is, from the server that decides it.
type Replica struct {
	// Name is the walsender's application_name: the standby's
	// primary_conninfo application_name, else its cluster_name, else
	// "walreceiver".
	Name string
	// Addr is the standby's address (client_addr); invalid when the
	// standby connected through a Unix socket.
	Addr netip.Addr
	// Sync is sync_state: ReplicaSync, ReplicaQuorum, ReplicaPotential or
	// ReplicaAsync.
	Sync string
	// ReplayLSN is replay_lsn, 0 when NULL.
	ReplayLSN uint64
	// Lag is replay_lag; NULL, which the server shows while a standby is
	// caught up and idle, counts as 0.
	Lag time.Duration
}

// sync_state values.
const (
	ReplicaSync      = "sync"      // a synchronous standby: it has every commit acknowledged to a client
	ReplicaQuorum    = "quorum"    // a candidate of ANY n: a given commit may have waited for others
	ReplicaPotential = "potential" // would become sync if one ahead of it in FIRST n went
	ReplicaAsync     = "async"
)

// maxReplicas bounds the standbys a verdict lists: far above any real
// primary's, so that what a server (or anyone between it and us) sends
// stays small.
const maxReplicas = 64

// replicasColumn is pgQuery's fifth column: on a primary, its walsenders
// as a JSON array of [application_name, client_addr, sync_state,
// replay_lsn, replay_lag in seconds]; NULL on a standby. A role without
// pg_monitor (pg_read_all_stats) sees every column NULL.
const replicasColumn = `CASE WHEN r THEN NULL ELSE (SELECT coalesce(json_agg(json_build_array(
    application_name, host(client_addr), sync_state, replay_lsn::text, extract(epoch FROM replay_lag))), '[]')
  FROM pg_stat_replication) END`

// parseReplicas reads replicasColumn: the replicas in name (then address)
// order, or hidden when the server showed walsenders without their columns.
// NULL (nil) is a standby's: nothing.
func parseReplicas(b []byte) (rs []Replica, hidden bool, err error) {
	if b == nil {
		return nil, false, nil
	}
	var rows [][]*json.RawMessage
	if err := json.Unmarshal(b, &rows); err != nil {
		return nil, false, fmt.Errorf("pg_stat_replication's rows: %v", err)
	}
	rs = []Replica{}
	for _, row := range rows {
		if len(row) != 5 {
			return nil, false, fmt.Errorf("a pg_stat_replication row of %d columns, not 5", len(row))
		}
		var name, addr, state, lsn *string
		var lag *float64
		for i, dst := range []any{&name, &addr, &state, &lsn, &lag} {
			if row[i] != nil {
				if err := json.Unmarshal(*row[i], dst); err != nil {
					return nil, false, fmt.Errorf("pg_stat_replication column %d: %v", i+1, err)
				}
			}
		}
		if state == nil {
			// A walsender whose columns this role may not read.
			hidden = true
			continue
		}
		r := Replica{Sync: *state}
		switch r.Sync {
		case ReplicaSync, ReplicaQuorum, ReplicaPotential, ReplicaAsync:
		default:
			return nil, false, fmt.Errorf("sync_state %q", r.Sync)
		}
		if name != nil {
			r.Name = *name
		}
		if addr != nil {
			if r.Addr, err = netip.ParseAddr(*addr); err != nil {
				return nil, false, fmt.Errorf("client_addr %q: %v", *addr, err)
			}
		}
		if lsn != nil {
			if r.ReplayLSN, err = parseLSN(*lsn); err != nil {
				return nil, false, err
			}
		}
		if lag != nil {
			if !(*lag >= 0) || *lag > math.MaxInt64/float64(time.Second) {
				return nil, false, fmt.Errorf("replay_lag %v s", *lag)
			}
			r.Lag = time.Duration(*lag * float64(time.Second))
		}
		rs = append(rs, r)
	}
	if hidden {
		return nil, true, nil
	}
	slices.SortFunc(rs, compareReplicas)
	if len(rs) > maxReplicas {
		return nil, false, errors.New("pg_stat_replication lists more than 64 standbys")
	}
	return rs, false, nil
}

// compareReplicas orders replicas by name, then address.
func compareReplicas(a, b Replica) int {
	return cmp.Or(cmp.Compare(a.Name, b.Name), a.Addr.Compare(b.Addr))
}

// SameReplicas reports whether a and b list the same standbys in the same
// sync states; with progress, at the same replay positions and lags too.
func SameReplicas(a, b []Replica, progress bool) bool {
	return slices.EqualFunc(a, b, func(x, y Replica) bool {
		return x.Name == y.Name && x.Addr == y.Addr && x.Sync == y.Sync &&
			(!progress || x.ReplayLSN == y.ReplayLSN && x.Lag == y.Lag)
	})
}
