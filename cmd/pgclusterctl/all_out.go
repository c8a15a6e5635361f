package main

import (
	"fmt"
	"strings"
)

// allOut is why every node is out, when that is one reason for all: most
// often an option pgclusterctl was not given as the fleet has it (the
// demo's loopback addresses without -allow-loopback), or a process that
// keeps the registry current that has stopped.
type allOut struct {
	Reason string `json:"reason"` // the word an instance shows in TXT
	Hint   string `json:"hint"`   // what it means, and what to do
}

// allOutFor returns why every node of r is out, when no node serves or is
// of unknown state and every one is out for the same reason; nil
// otherwise. o are the options r was judged with.
func allOutFor(r *report, o fleetOptions) *allOut {
	reason := ""
	for _, c := range r.Clusters {
		for _, n := range c.Nodes {
			if n.State != "out" || reason != "" && n.Reason != reason {
				return nil
			}
			reason = n.Reason
		}
	}
	if reason == "" {
		return nil
	}
	return &allOut{Reason: reason, Hint: allOutHint(reason, o)}
}

// allOutHint says what it means that every node is out for reason.
func allOutHint(reason string, o fleetOptions) string {
	switch reason {
	case "loopback":
		return "their addresses are loopback addresses, which the fleet answers only with allow_loopback; if its Corefile has allow_loopback (the demo's does), use -allow-loopback"
	case "stale":
		return fmt.Sprintf("every heartbeat is older than -stale-after %v; whatever writes the heartbeats (UPDATE pgcluster_nodes SET heartbeat = now()) has stopped, or -stale-after is not the fleet's stale_after", o.judge.StaleAfter)
	case "heartbeat_in_future":
		return "every heartbeat is in the future; check the clock of whatever writes them"
	case "unhealthy":
		return "the registry marks every node unhealthy (healthy = false)"
	case "no_address":
		return "no node has an address in the registry"
	case "unusable_address":
		return "no node has an address a client can use: see REASON"
	}
	if strings.HasPrefix(reason, "check_") {
		return "every node fails the fleet's check for the same cause; look at what they share: the network from the instances, or the role and password of check postgres"
	}
	return "see REASON"
}
