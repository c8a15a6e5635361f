package main

import (
	"fmt"
	"strings"
)

// A drain's guards keep the shared names of its cluster answering: it is
// refused, unless forced, when it takes out a primary, or the last serving
// nodes of the cluster's name (which its aliases and SRV records answer
// too) or of standby. (replica. is the same set). prefer-standby. needs no
// guard: it answers the primary when no standby serves, and the primary
// has a guard of its own.

// refusal is a guard that refuses a drain: what the drain would do, and
// what to do instead.
type refusal struct {
	what string
	hint string
}

func (r refusal) String() string { return r.what + "; " + r.hint }

// guards returns the refusals of d, a drain of a cluster judged in r, with
// the cluster's other active drains, in DNS zone zone. A node serves as
// the fleet would answer it now: judged in by status's own judgement (the
// registry and, when read, the fleet's checks) and drained by none of
// others. A node of unknown state (its stored check is stale) may serve,
// but is never counted on: taking one out counts as taking a serving node
// out, and leaving only such nodes as leaving none.
func guards(r *report, d drain, others []drain, zone string) []refusal {
	c, ok := r.clusterNamed(strings.ToLower(d.Cluster))
	if !ok {
		return nil
	}
	matched := map[string]bool{}
	for _, n := range d.Matches {
		matched[n] = true
	}
	drained := map[string]bool{}
	for _, o := range others {
		for _, n := range o.Matches {
			drained[n] = true
		}
	}
	var refused []refusal
	var all, standbys []nodeReport
	for _, n := range c.Nodes {
		if matched[n.Name] && n.role == "primary" {
			refused = append(refused, refusal{
				what: fmt.Sprintf("%s is the primary of %s", n.Name, c.Name),
				hint: "switch over first (pg_ctl promote a standby), or -force",
			})
		}
		if drained[n.Name] || n.State == "out" {
			continue
		}
		all = append(all, n)
		if n.role == "standby" && !n.Lagging {
			standbys = append(standbys, n)
		}
	}
	name := c.Name + "." + fqdn(zone)
	for _, set := range []struct {
		name  string
		nodes []nodeReport
	}{{name, all}, {"standby." + name, standbys}} {
		if now, ok := emptied(set.nodes, matched); ok {
			refused = append(refused, refusal{
				what: fmt.Sprintf("draining %s would leave %s with no serving node (%s)", d.subject(), set.name, now),
				hint: "-force drains anyway",
			})
		}
	}
	return refused
}

// emptied reports whether draining the nodes matched takes one of set out
// and leaves none of it that serves; now says which serve now.
func emptied(set []nodeReport, matched map[string]bool) (now string, ok bool) {
	var serving, unknown []string
	out, left := false, 0
	for _, n := range set {
		if n.State == stateUnknown {
			unknown = append(unknown, n.Name)
		} else {
			serving = append(serving, n.Name)
		}
		switch {
		case matched[n.Name]:
			out = true
		case n.State != stateUnknown:
			left++
		}
	}
	if !out || left > 0 {
		return "", false
	}
	now = fmt.Sprintf("%d serving now", len(serving))
	if len(serving) > 0 {
		now += ": " + strings.Join(serving, ", ")
	}
	if len(unknown) > 0 {
		now += fmt.Sprintf("; %d of unknown state, never counted on: %s", len(unknown), strings.Join(unknown, ", "))
	}
	return now, true
}

// clusterNamed is the cluster of r named name (in lower case, as served).
func (r *report) clusterNamed(name string) (clusterReport, bool) {
	for _, c := range r.Clusters {
		if c.Name == name {
			return c, true
		}
	}
	return clusterReport{}, false
}

// fqdn is a zone as it ends a name: in lower case, with its final dot.
func fqdn(zone string) string {
	zone = strings.ToLower(zone)
	if !strings.HasSuffix(zone, ".") {
		zone += "."
	}
	return zone
}
