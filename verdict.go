package pgcluster

import (
	"fmt"
	"net/netip"
	"time"
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
	switch {
	case !n.Healthy:
		m.out(reasonUnhealthy, "the registry marks it unhealthy")
	case in.staleAfter > 0 && n.HeartbeatAge > in.staleAfter:
		m.out(reasonStale, fmt.Sprintf("heartbeat %s old, stale_after %s", age(n.HeartbeatAge), in.staleAfter))
	case in.staleAfter > 0 && n.HeartbeatAge < -in.staleAfter:
		m.out(reasonFutureHeartbeat, fmt.Sprintf("heartbeat %s in the future, more than stale_after %s: check the clock of whoever writes it", age(-n.HeartbeatAge), in.staleAfter))
	case !m.addr.IsValid():
		m.out(reasonNoAddress, "no address")
	case unusable(n, m.addr) != "":
		m.out(reasonUnusableAddress, unusable(n, m.addr))
	case m.addr.IsLoopback() && !in.allowLoopback:
		m.out(reasonLoopback, "loopback address "+m.addr.String()+" is not advertised")
	default:
		m.serving = true
		m.reason = reasonServing
	}
	return m
}

func (m *member) out(reason, detail string) {
	m.serving, m.reason, m.detail = false, reason, detail
}

// verdict is what logs say of a node: in or out, and the stable reason.
func (m *member) verdict() string {
	if m.serving {
		return "in (" + m.reason + ")"
	}
	return "out (" + m.reason + ")"
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
