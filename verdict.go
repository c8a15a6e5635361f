package pgcluster

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// Verdict reasons: why a node is in or out. They are stable words, shown in
// TXT as reason=, logged when they change and part of the content hash; the
// numbers behind them (a heartbeat's age, the address) go in TXT's detail=
// only, so that the serial and the log change only when an answer does.
const (
	reasonServing         = "serving"
	reasonUnhealthy       = "unhealthy"
	reasonStale           = "stale"
	reasonFutureHeartbeat = "heartbeat_in_future"
	reasonNoAddress       = "no_address"
	reasonLoopback        = "loopback"
	reasonUnusableAddress = "unusable_address"
	// reasonStalePrimary: a primary on an older timeline than another
	// primary of the same system (split_brain newest_timeline): a standby
	// was promoted while it kept running.
	reasonStalePrimary = "stale_primary"
	// reasonCheckPrefix and the check's cause ("check_refused",
	// "check_timeout", ...): the active check failed.
	reasonCheckPrefix = "check_"
)

// judge decides whether a node serves, which address it advertises, and why.
// It is the one place that decides in or out.
func judge(n Node, in buildInput) *member {
	m := &member{Node: n, addr: n.Address.Unmap()}
	if m.addr.IsLoopback() {
		if a, ok := in.self[n.Cluster+"/"+n.Name]; ok {
			m.addr = a
		} else if a, ok := in.self[n.Name]; ok {
			m.addr = a
		}
	}
	bad := unusable(n, m.addr)
	switch {
	case !n.Healthy:
		m.out(reasonUnhealthy, "the registry marks it unhealthy")
	case in.staleAfter > 0 && n.HeartbeatAge > in.staleAfter:
		m.out(reasonStale, fmt.Sprintf("heartbeat %s, older than stale_after %s", heartbeatText(n, n.HeartbeatAge, "old"), in.staleAfter))
	case in.staleAfter > 0 && n.HeartbeatAge < -in.staleAfter:
		m.out(reasonFutureHeartbeat, fmt.Sprintf("heartbeat %s, more than stale_after %s: check the clock of whoever writes it", heartbeatText(n, -n.HeartbeatAge, "in the future"), in.staleAfter))
	case !m.addr.IsValid():
		m.out(reasonNoAddress, "no address")
	case bad != "":
		m.out(reasonUnusableAddress, bad)
	case m.addr.IsLoopback() && !in.allowLoopback:
		m.out(reasonLoopback, "loopback address "+m.addr.String()+" is not advertised")
	default:
		m.serving = true
		m.reason = reasonServing
	}
	m.registryOK = m.serving
	if in.checksOn() {
		m.target = checkTarget(n)
		m.checkVerdict(in.view.At(n.Cluster+"/"+n.Name), in.check)
	}
	return m
}

// checkVerdict applies the check's verdict v to a node the registry allows:
// down takes it out, with the check's cause as the reason; up with a role
// read from PostgreSQL decides the role, whatever the registry says. A node
// not checked yet keeps the registry's judgement and role.
func (m *member) checkVerdict(v health.Verdict, check string) {
	m.check, m.lag = v, -1
	if !m.serving {
		return
	}
	switch v.State {
	case health.Down:
		m.out(reasonCheckPrefix+v.Cause, "check "+check+" failed: "+v.Detail)
	case health.Up:
		if v.Role != "" {
			m.Role = v.Role
		}
	}
}

// checkTarget is where a node's check connects: the registry's address and
// port, not an address substituted by self; none for an address no client
// could use.
func checkTarget(n Node) netip.AddrPort {
	a := n.Address.Unmap()
	if !a.IsValid() || unusable(n, a) != "" || n.Port < 1 || n.Port > 65535 {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(a, uint16(n.Port))
}

// judgeTimelines settles a split brain by timelines (split_brain
// newest_timeline). Of the nodes that claim to be primary as their checks
// last read them, serving or not, those made from one initdb (one system
// identifier) are one history: a promotion moves the promoted server to a
// new timeline, so one on an older timeline is the primary it replaced,
// still running. Those are stale: out, answered nowhere, fail-open
// included. A serving one says why in TXT. Primaries of different systems,
// or of an unknown timeline, are a true split brain: left to the gate.
func (c *cluster) judgeTimelines() {
	var claim []*member
	for _, m := range c.members {
		if m.check.Role == rolePrimary && m.check.Timeline != 0 && m.check.SystemID != 0 && m.registryOK {
			claim = append(claim, m)
		}
	}
	if len(claim) < 2 {
		return
	}
	var newest uint32
	for _, m := range claim {
		if m.check.SystemID != claim[0].check.SystemID {
			return
		}
		newest = max(newest, m.check.Timeline)
	}
	for _, m := range claim {
		if m.check.Timeline >= newest {
			continue
		}
		m.stale = true
		if m.serving {
			m.out(reasonStalePrimary, fmt.Sprintf("timeline %d < %d: a newer primary of the same system serves", m.check.Timeline, newest))
		}
	}
}

// promoted is, while more than one serving member claims to be primary,
// the one a promotion made: every claimant of one system (one initdb), one
// on a timeline newer than all the others'. A planned switchover or a
// fail-over looks so for the moment between the promoted server's first
// poll as primary and the old primary's session ending (heard in the same
// instant by one instance, a few milliseconds apart through Redis, later on
// a loaded machine): see the hand-over in primary_hold.go. Else nil.
func (c *cluster) promoted() *member {
	if len(c.primaries) < 2 {
		return nil
	}
	var newest *member
	tied := false
	for _, m := range c.primaries {
		if m.check.Timeline == 0 || m.check.SystemID == 0 || m.check.SystemID != c.primaries[0].check.SystemID {
			return nil
		}
		switch {
		case newest == nil || m.check.Timeline > newest.check.Timeline:
			newest, tied = m, false
		case m.check.Timeline == newest.check.Timeline:
			tied = true
		}
	}
	if tied {
		return nil
	}
	return newest
}

// judgePrimaries finds the serving members that claim to be primary. A
// primary whose server ended the check's session is leaving (shutting down
// or dead, until the probe that follows says which): it does not make a
// split brain with a primary that is not, which is then the one primary. So
// a standby promoted as the old primary stops is primary. at once, whichever
// of the two the checks hear of first.
func (c *cluster) judgePrimaries() {
	var all, settled []*member
	for _, m := range c.members {
		if m.serving && m.Role == rolePrimary {
			all = append(all, m)
			if !m.check.Leaving {
				settled = append(settled, m)
			}
		}
	}
	c.primaries = all
	if len(all) > 1 && len(settled) > 0 {
		c.primaries = settled
	}
}

// judgeLag measures each standby's replication lag behind the cluster's
// primary, as both checks last read their WAL positions, and marks those
// further behind than maxLag. Without exactly one serving primary whose
// position is known, lag is unknown and nobody is marked.
func (c *cluster) judgeLag(maxLag int64) {
	if len(c.primaries) != 1 {
		return
	}
	primary := c.primaries[0]
	if primary.check.State != health.Up || primary.check.WAL == 0 {
		return
	}
	for _, m := range c.members {
		if m.Role != roleStandby || m.check.State != health.Up || m.check.WAL == 0 {
			continue
		}
		m.lag = 0
		if primary.check.WAL > m.check.WAL {
			m.lag = int64(min(primary.check.WAL-m.check.WAL, 1<<62))
		}
		m.lagging = m.serving && m.lag > maxLag
	}
}

func (m *member) out(reason, detail string) {
	m.serving, m.reason, m.detail = false, reason, detail
}

// verdict is what logs say of a node: in or out, and the stable reason.
func (m *member) verdict() string {
	switch {
	case m.Drain.drained():
		// Logged once as it is drained, once as it comes back: the
		// drain's id says which, its reason is in TXT.
		state := "out"
		if m.serving {
			state = "in"
		}
		return fmt.Sprintf("drained (drain %d; its own name: %s, %s)", m.Drain.ID, state, m.reason)
	case m.serving && m.lagging:
		return "in (" + m.reason + ", lagging: out of standby.)"
	case m.serving:
		return "in (" + m.reason + ")"
	}
	return "out (" + m.reason + ")"
}

// heartbeatText shows a heartbeat judged by stale_after: its time as stored
// when it is one (it stays true while the node stays out, and the names are
// built again only when something changes), else how far it is, d, and
// which way (a heartbeat too old or too young for time.Duration).
func heartbeatText(n Node, d time.Duration, way string) string {
	if !n.Heartbeat.IsZero() {
		return n.Heartbeat.UTC().Format("2006-01-02T15:04:05.000Z07:00")
	}
	return age(d) + " " + way
}

// maxAge is shown for ages clamped at the bounds of time.Duration.
const maxAge = 100 * 365 * 24 * time.Hour

// age renders a heartbeat age for TXT, in whole milliseconds.
func age(d time.Duration) string {
	if d >= maxAge || d < 0 {
		return "over 100 years"
	}
	return d.Round(time.Millisecond).String()
}

// unusable says why a client could never connect to addr as a node's
// address, or returns "" when it could.
func unusable(n Node, addr netip.Addr) string {
	if n.Network.IsValid() {
		return n.Network.String() + " is a network, not a host address"
	}
	if why := unusableAddr(addr); why != "" {
		return addr.String() + " is " + why
	}
	return ""
}

var broadcast4 = netip.AddrFrom4([4]byte{255, 255, 255, 255})

// unusableAddr says what kind of address a is when no other host could
// connect to it, or returns "".
func unusableAddr(a netip.Addr) string {
	switch {
	case a.IsUnspecified():
		return "the unspecified address"
	case a.IsMulticast():
		return "a multicast address"
	case a == broadcast4:
		return "the broadcast address"
	case a.IsLinkLocalUnicast():
		return "a link-local address, which needs an interface and reaches only the local link"
	}
	return ""
}
