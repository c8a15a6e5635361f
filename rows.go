package pgcluster

import (
	"net/netip"
	"time"
)

// Node is one row of pgcluster_nodes, as loaded.
type Node struct {
	Cluster string
	Name    string
	Address netip.Addr
	// Network is set when the registry stored the address with a mask
	// shorter than a host's (inet '10.1.0.0/16'): a network, never served.
	Network netip.Prefix
	Port    int
	Role    string
	Healthy bool
	// HeartbeatAge is how old the heartbeat was when the row was read,
	// measured by PostgreSQL's own clock. Heartbeats too old or too far in
	// the future for a time.Duration are clamped to its bounds.
	HeartbeatAge time.Duration
	// Heartbeat is the heartbeat itself, as stored: shown for a node judged
	// stale, since it does not change while its age does. Zero when it is
	// not a moment (NULL, or infinite in a registry older than the checks
	// that refuse it).
	Heartbeat time.Time
}

// Alias is one row of pgcluster_aliases.
type Alias struct {
	Alias  string
	Target string
}

// Roles and the reserved labels inside a cluster.
const (
	rolePrimary = "primary"
	roleStandby = "standby"

	labelPrimary       = "primary"
	labelStandby       = "standby"
	labelReplica       = "replica"
	labelPreferStandby = "prefer-standby"
	labelSRV           = "_postgresql._tcp"
	labelNS            = "ns"
)

// reservedInCluster are labels a node may not take.
var reservedInCluster = map[string]bool{
	labelPrimary: true, labelStandby: true, labelReplica: true, labelPreferStandby: true,
}

// isLabel reports whether s is a host name label: letters, digits and inner
// hyphens, at most 63 characters.
func isLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
