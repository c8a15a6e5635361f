package pgcluster

import (
	"fmt"
	"strings"
	"time"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/printable"
)

// nodeTXT explains a node's state: in or out, its role, why, and the
// numbers behind the why.
func nodeTXT(m *member, primaries int, set *settings) []string {
	state := "out"
	if m.serving {
		state = "in"
	}
	detail := m.detail
	if m.serving && m.Role == rolePrimary && primaries > 1 {
		detail = fmt.Sprintf("%d nodes claim to be primary: primary. has no address", primaries)
	}
	// address= is the address answered, the one a client connects to:
	// with self, not the registry's loopback address, which follows as
	// registry_address= (where the checks connect).
	txt := []string{"state=" + state, "role=" + m.Role, "address=" + m.addr.String()}
	if reg := m.Address.Unmap(); reg != m.addr {
		txt = append(txt, "registry_address="+reg.String())
	}
	txt = append(txt, fmt.Sprintf("port=%d", m.Port), "reason="+m.reason)
	if m.Region != "" {
		txt = append(txt, "region="+m.Region)
	}
	if m.Zone != "" {
		txt = append(txt, "zone="+m.Zone)
	}
	if m.placeIgnored != "" {
		txt = append(txt, printable.Cut("place_ignored="+m.placeIgnored, maxTXTString))
	}
	if detail != "" {
		txt = append(txt, printable.Cut("detail="+detail, maxTXTString))
	}
	if m.Drain.drained() {
		txt = append(txt, printable.Cut("drained="+drainText(m.Drain), maxTXTString))
	}
	if set != nil && set.checksOn() {
		txt = append(txt, checkTXT(m, set)...)
	}
	return txt
}

// checkTXT is what the active check says of a node: its state, the role it
// read, the replication lag, and when it last probed (as of this snapshot:
// the zone is rebuilt when a verdict changes, not at every probe).
func checkTXT(m *member, set *settings) []string {
	v := m.check
	txt := []string{"check=" + set.check + " " + v.State.String()}
	if v.Role != "" {
		txt = append(txt, "check_role="+v.Role)
	}
	if v.State == health.Down {
		txt = append(txt, "check_cause="+v.Cause)
	}
	switch {
	case m.lag >= 0 && m.lagging:
		txt = append(txt, fmt.Sprintf("lag=%d bytes, over max_lag %d: out of standby.", m.lag, set.maxLag))
	case m.lag >= 0:
		txt = append(txt, fmt.Sprintf("lag=%d", m.lag))
	}
	if set.check == checkPostgres && m.Role == roleStandby {
		txt = append(txt, replicaTXT(m, set)...)
	}
	if !v.Last.IsZero() {
		txt = append(txt, "checked="+v.Last.UTC().Format(time.RFC3339Nano))
	}
	return txt
}

// Values of state= in the TXT record of primary.<cluster>: what its address
// answer is. A client may look for the primary itself (connect to the
// cluster's nodes and keep the one that accepts writes) only while it is
// held or none, never in split brain.
const (
	primaryServing   = "serving"     // the one serving primary
	primaryHeldState = "held"        // a primary that left by its check, held while no other is primary
	primaryFailOpen  = "fail_open"   // the one primary whose check fails, answered by all_down open
	primaryNone      = "none"        // no address: no node claims to be primary
	primarySplit     = "split_brain" // no address: two or more serving nodes claim to be primary
)

// primaryTXT says what primary.<cluster> answers and why: primaries are the
// serving nodes that claim to be primary, answered the nodes its address
// records name.
func primaryTXT(primaries, answered []*member, held, failOpen bool) []string {
	switch {
	case len(primaries) > 1:
		return []string{"state=" + primarySplit, fmt.Sprintf("primaries=%d", len(primaries))}
	case len(answered) == 0 && len(primaries) == 1 && primaries[0].Drain.drained():
		// The one primary is drained (pgclusterctl drain -force): no
		// address, as with none, and which one and why.
		return []string{"state=" + primaryNone, "drained=" + primaries[0].Name}
	case len(answered) == 0:
		return []string{"state=" + primaryNone}
	case held:
		m := answered[0]
		return []string{"state=" + primaryHeldState, "node=" + m.Name, "reason=" + m.reason}
	case failOpen:
		return []string{"state=" + primaryFailOpen, "node=" + answered[0].Name, "reason=" + answered[0].reason}
	}
	return []string{"state=" + primaryServing, "node=" + answered[0].Name}
}

// clusterTXT sums a cluster up: nodes in and out, and the nodes that claim to
// be primary. At most maxListed primaries are named, in strings that each
// fit a TXT character-string, so the record packs whatever the registry holds.
func clusterTXT(st clusterStat) []string {
	txt := []string{fmt.Sprintf("serving=%d", st.serving), fmt.Sprintf("out=%d", st.out)}
	if st.drained > 0 {
		txt = append(txt, fmt.Sprintf("drained=%d", st.drained))
	}
	names := st.primaries
	more := 0
	if len(names) > maxListed {
		names, more = names[:maxListed], len(names)-maxListed
	}
	cur := "primary="
	for i, n := range names {
		if i > 0 {
			if len(cur)+1+len(n) > maxTXTString {
				txt = append(txt, cur)
				cur = "primary+="
			} else {
				cur += ","
			}
		}
		cur += n
	}
	if more > 0 {
		tail := fmt.Sprintf(",+%d more", more)
		if len(cur)+len(tail) > maxTXTString {
			txt = append(txt, cur)
			cur = "primary+="
			tail = tail[1:]
		}
		cur += tail
	}
	return append(txt, cur)
}

// maxTXTString is the longest character-string a TXT record holds;
// maxListed bounds the primaries a cluster's TXT names.
const (
	maxTXTString = 255
	maxListed    = 8
)

// maxRole bounds the role shown in TXT records: the column is free text.
const maxRole = 63

// replicaTXT is what the cluster's primary says of standby m: its sync
// state and replay lag from pg_stat_replication, or why they are unknown.
func replicaTXT(m *member, set *settings) []string {
	r := m.replica
	switch {
	case r != nil:
		lag := "primary_lag=" + r.Lag.String()
		if set.maxLagTime > 0 && r.Lag > set.maxLagTime {
			lag += fmt.Sprintf(", over max_lag %v: out of standby.", set.maxLagTime)
		}
		return []string{"sync_state=" + r.Sync, lag}
	case m.replicas == replicasKnown:
		txt := "sync_state=none: not in the primary's pg_stat_replication (set application_name=" + m.Name + " in its primary_conninfo)"
		if set.maxLagTime > 0 {
			txt += "; its lag is unknown: out of standby."
		}
		return []string{txt}
	case m.replicas == replicasHidden:
		return []string{"sync_state=unknown: no_privilege (the check's role lacks pg_monitor, so pg_stat_replication hides its columns)"}
	}
	return nil
}

// syncTXT is the TXT record of sync.<cluster>: whether the primary's
// synchronous standbys are known, and which are answered.
func syncTXT(c *cluster, syncs []*member) []string {
	if c.replicas != replicasKnown {
		return []string{"state=" + c.replicas}
	}
	if len(syncs) == 0 {
		return []string{"state=none"}
	}
	names := make([]string, len(syncs))
	for i, m := range syncs {
		names[i] = m.Name
	}
	return []string{"state=serving", "nodes=" + strings.Join(names, ",")}
}

// drainText is what a node's TXT says of its drain: "<reason> (until
// <time>, by <who>)", the time in UTC as PostgreSQL stored it, "until
// undrained" when the drain has no end.
func drainText(d Drain) string {
	until := "until undrained"
	if d.Until != 0 {
		until = "until " + time.UnixMicro(d.Until).UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("%s (%s, by %s, drain %d)", d.Reason, until, d.By, d.ID)
}

// failoverTXT is the TXT of _failover.<alias>: the target it points at
// (target=), whether that is its own (state=primary) or a fallback it
// failed over to (state=failed_over, with moved= saying from where, when
// and why), its targets in order, and how it fails over and back.
func failoverTXT(a resolvedAlias) []string {
	r := a.row
	state := "primary"
	if !strings.EqualFold(r.effective(), r.Target) {
		state = "failed_over"
	}
	txt := []string{"target=" + a.target, "state=" + state, printable.Cut("targets="+strings.Join(r.targets(), ","), maxTXTString),
		"failover_when=" + r.when(), "failover_after=" + r.after().String()}
	failback := r.Failback
	if failback == "" {
		failback = failbackManual
	}
	txt = append(txt, "failback="+failback)
	if state == "failed_over" {
		txt = append(txt, printable.Cut(fmt.Sprintf("moved=failed over from %s at %s: %s", r.Target,
			time.UnixMicro(r.MovedAt).UTC().Format(time.RFC3339), r.Why), maxTXTString))
	}
	return txt
}
