package pgcluster

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The registry copy's fields (lock.RegistryCopy): one per served cluster,
// holding every row of the cluster, one holding every alias, and one
// holding every network. The networks' field is absent while there is
// none, so that an instance older than the networks (which refuses a field
// it does not know) reads the copy of a registry that has none.
const (
	clusterFieldPrefix = "n:"
	aliasesField       = "aliases"
	networksField      = "networks"
)

func clusterField(name string) string { return clusterFieldPrefix + name }

// wireNode is a Node as the copy holds it.
type wireNode struct {
	Cluster string       `json:"c"`
	Name    string       `json:"n"`
	Address netip.Addr   `json:"a,omitzero"`
	Network netip.Prefix `json:"net,omitzero"`
	Port    int          `json:"p"`
	Role    string       `json:"r"`
	Healthy bool         `json:"h,omitempty"`
	// Age is the heartbeat's age in ns when the follower published the
	// cluster: readers judge stale_after with it as the follower did, and
	// the follower writes the cluster again whenever that judgement
	// changes.
	Age int64 `json:"age"`
	// Beat is the heartbeat in Unix µs; nil when it is not a moment.
	Beat *int64 `json:"hb,omitempty"`
	// Region and Zone: absent when unknown, and in a copy written before
	// nodes had them.
	Region string `json:"rg,omitempty"`
	Zone   string `json:"z,omitempty"`
	// Drain is the node's drain; absent when it has none, and in a copy
	// written before drains (an instance older than drains ignores it).
	// When it ends, the follower reads the node again and writes the
	// cluster without it.
	Drain *wireDrain `json:"dr,omitempty"`
}

// wireDrain is a Drain as the copy holds it (never EndsAt: see Drain).
type wireDrain struct {
	ID     int64  `json:"id"`
	Reason string `json:"r"`
	By     string `json:"by"`
	Until  int64  `json:"u,omitempty"`
}

// wireNetwork is a Network as the copy holds it.
type wireNetwork struct {
	Network netip.Prefix `json:"net"`
	Region  string       `json:"rg,omitempty"`
	Zone    string       `json:"z,omitempty"`
}

func encodeNodes(ns []Node) []byte {
	w := make([]wireNode, len(ns))
	for i, n := range ns {
		w[i] = wireNode{Cluster: n.Cluster, Name: n.Name, Address: n.Address, Network: n.Network,
			Port: n.Port, Role: n.Role, Healthy: n.Healthy, Age: int64(n.HeartbeatAge), Region: n.Region, Zone: n.Zone}
		if !n.Heartbeat.IsZero() {
			us := n.Heartbeat.UnixMicro()
			w[i].Beat = &us
		}
		if d := n.Drain; d.drained() {
			w[i].Drain = &wireDrain{ID: d.ID, Reason: d.Reason, By: d.By, Until: d.Until}
		}
	}
	b, _ := json.Marshal(w) // strings, numbers and addresses: cannot fail
	return b
}

func decodeNodes(b []byte) ([]Node, error) {
	var w []wireNode
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, err
	}
	ns := make([]Node, len(w))
	for i, n := range w {
		ns[i] = Node{Cluster: n.Cluster, Name: n.Name, Address: n.Address, Network: n.Network,
			Port: n.Port, Role: n.Role, Healthy: n.Healthy, HeartbeatAge: time.Duration(n.Age), Region: n.Region, Zone: n.Zone}
		if n.Beat != nil {
			ns[i].Heartbeat = time.UnixMicro(*n.Beat)
		}
		if d := n.Drain; d != nil {
			if d.ID == 0 {
				return nil, fmt.Errorf("node %d: a drain without an id", i)
			}
			ns[i].Drain = Drain{ID: d.ID, Reason: d.Reason, By: d.By, Until: d.Until}
		}
	}
	return ns, nil
}

// encodeAliases writes each alias as [alias, target], its target being
// where it points now (see Alias.effective): an instance older than
// fail-over, which reads the first two strings alone, points where the
// fleet does. An alias with fail-over settings or a move has eight strings
// more: its own target, fallback, failover_when, failover_after in ns,
// failback, the target moved to, why, and when (Unix µs).
func encodeAliases(as []Alias) []byte {
	w := make([][]string, len(as))
	for i, a := range as {
		w[i] = []string{a.Alias, a.effective()}
		if a.Fallback != "" || a.When != "" || a.Failback != "" || a.Moved != "" || a.After != 0 {
			w[i] = append(w[i], a.Target, a.Fallback, a.When, strconv.FormatInt(int64(a.After), 10), a.Failback,
				a.Moved, a.Why, strconv.FormatInt(a.MovedAt, 10))
		}
	}
	b, _ := json.Marshal(w)
	return b
}

func decodeAliases(b []byte) ([]Alias, error) {
	var w [][]string
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, err
	}
	as := make([]Alias, len(w))
	for i, a := range w {
		switch len(a) {
		case 2:
			as[i] = Alias{Alias: a[0], Target: a[1]}
		case 10:
			after, err1 := strconv.ParseInt(a[5], 10, 64)
			at, err2 := strconv.ParseInt(a[9], 10, 64)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("alias %d: failover_after %q or moved at %q is not a number", i, clip(a[5]), clip(a[9]))
			}
			as[i] = Alias{Alias: a[0], Target: a[2], Fallback: a[3], When: a[4], After: time.Duration(after),
				Failback: a[6], Moved: a[7], Why: a[8], MovedAt: at}
		default:
			return nil, fmt.Errorf("alias %d: %d strings, want 2 or 10", i, len(a))
		}
	}
	return as, nil
}

// clip is the start of a string read from the copy, for an error message.
func clip(s string) string {
	if len(s) > 24 {
		return s[:24] + "..."
	}
	return s
}

func encodeNetworks(ns []Network) []byte {
	w := make([]wireNetwork, len(ns))
	for i, n := range ns {
		w[i] = wireNetwork{Network: n.Network, Region: n.Region, Zone: n.Zone}
	}
	b, _ := json.Marshal(w)
	return b
}

func decodeNetworks(b []byte) ([]Network, error) {
	var w []wireNetwork
	if err := json.Unmarshal(b, &w); err != nil {
		return nil, err
	}
	ns := make([]Network, len(w))
	for i, n := range w {
		if !n.Network.IsValid() {
			return nil, fmt.Errorf("network %d is not a network", i)
		}
		ns[i] = Network{Network: n.Network.Masked(), Region: n.Region, Zone: n.Zone}
	}
	return ns, nil
}

// copyFields returns the copy's fields for the clusters named (nil for one
// without rows: deleted) and, with aliases, the aliases, with networks, the
// networks (nil when there is none), as rows holds them.
func copyFields(rows *rowSet, clusters map[string]bool, aliases, networks bool) map[string][]byte {
	out := make(map[string][]byte, len(clusters)+2)
	for name := range clusters {
		var b []byte
		if c, ok := rows.clusters[name]; ok {
			b = encodeNodes(c.nodes)
		}
		out[clusterField(name)] = b
	}
	if aliases {
		out[aliasesField] = encodeAliases(rows.aliasList())
	}
	if networks {
		var b []byte
		if len(rows.networks) > 0 {
			b = encodeNetworks(rows.networks)
		}
		out[networksField] = b
	}
	return out
}

// allFields returns every field of the copy rows makes; the networks'
// only when there are some.
func allFields(rows *rowSet) map[string][]byte {
	return copyFields(rows, setOf(maps.Keys(rows.clusters)), true, len(rows.networks) > 0)
}

func setOf(keys func(func(string) bool)) map[string]bool {
	out := map[string]bool{}
	for k := range keys {
		out[k] = true
	}
	return out
}

// updateFromCopy is the update the fields read from the copy make: those
// changed (a nil value: the cluster is gone), or, with full, every field.
func updateFromCopy(fields map[string][]byte, full bool) (rowsUpdate, error) {
	u := rowsUpdate{full: full, nodes: map[string][]Node{}}
	for _, f := range slices.Sorted(maps.Keys(fields)) {
		b := fields[f]
		if f == aliasesField {
			if b == nil {
				u.aliases, u.aliasesSet = nil, true
				continue
			}
			as, err := decodeAliases(b)
			if err != nil {
				return u, fmt.Errorf("field %q: %w", f, err)
			}
			u.aliases, u.aliasesSet = as, true
			continue
		}
		if f == networksField {
			if b == nil {
				u.networks, u.networksSet = nil, true
				continue
			}
			ns, err := decodeNetworks(b)
			if err != nil {
				return u, fmt.Errorf("field %q: %w", f, err)
			}
			u.networks, u.networksSet = ns, true
			continue
		}
		name, ok := strings.CutPrefix(f, clusterFieldPrefix)
		if !ok {
			return u, fmt.Errorf("unknown field %q", f)
		}
		if b == nil {
			u.nodes[name] = nil
			continue
		}
		ns, err := decodeNodes(b)
		if err != nil {
			return u, fmt.Errorf("field %q: %w", f, err)
		}
		u.nodes[name] = ns
	}
	if full && !u.aliasesSet {
		u.aliasesSet = true // a copy without the field has no alias
	}
	if full && !u.networksSet {
		u.networksSet = true // nor one without this field a network
	}
	return u, nil
}
