package pgcluster

import (
	"net/netip"
	"time"
)

// settings is a parsed pgcluster block: every option, under one name each,
// shared (read-only once started) by the parser, the registry follower, the
// publisher and build.
type settings struct {
	zones         []string
	dsn           string
	ttl           uint32
	refresh       time.Duration
	staleAfter    time.Duration
	allowLoopback bool
	// self maps a node ("name" or "cluster/name") to the address to
	// advertise instead of its loopback one. As parsed, the invalid Addr
	// means "this host's outbound address"; start resolves it.
	self map[string]netip.Addr
	// nsAddrs are this instance's own addresses, for ns.<zone>; set at start.
	nsAddrs []netip.Addr
}

// resolveAddrs finds this host's outbound addresses: for ns.<zone>, and for
// the self options given without an address. A self option that finds none
// is dropped with a warning: its node's loopback address stays unadvertised.
func (s *settings) resolveAddrs() {
	v4, v6 := outboundAddrs()
	self := make(map[string]netip.Addr, len(s.self))
	for node, a := range s.self {
		if !a.IsValid() {
			if a = v4; !a.IsValid() {
				a = v6
			}
			if !a.IsValid() {
				log.Warningf("self %s: no outbound address found; its loopback address stays unadvertised", node)
				continue
			}
		}
		self[node] = a
	}
	s.self = self
	s.nsAddrs = nil
	for _, a := range []netip.Addr{v4, v6} {
		if a.IsValid() {
			s.nsAddrs = append(s.nsAddrs, a)
		}
	}
}
