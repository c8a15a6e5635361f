package pgcluster

import (
	"errors"
	"net"
	"net/netip"
)

// Targets used to ask the kernel which source address it would use. Connecting
// a UDP socket sends no packet: it only selects a route and a local address.
var (
	routeProbe4 = "192.0.2.1:9"
	routeProbe6 = "[2001:db8::1]:9"
)

// outboundAddrs returns this host's outbound IPv4 and IPv6 addresses, found
// with non-sending UDP sockets, falling back to the first global unicast
// address of an interface that is up. Either may be invalid.
func outboundAddrs() (v4, v6 netip.Addr) {
	v4, _ = routeSource("udp4", routeProbe4)
	v6, _ = routeSource("udp6", routeProbe6)
	if v4.IsValid() && v6.IsValid() {
		return v4, v6
	}
	ifaces, _ := net.Interfaces()
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 || ifc.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			ipn, ok := a.(*net.IPNet)
			if !ok {
				continue
			}
			ip, ok := netip.AddrFromSlice(ipn.IP)
			if !ok || !ip.IsGlobalUnicast() {
				continue
			}
			ip = ip.Unmap()
			if ip.Is4() && !v4.IsValid() {
				v4 = ip
			}
			if ip.Is6() && !v6.IsValid() {
				v6 = ip
			}
		}
	}
	return v4, v6
}

func routeSource(network, target string) (netip.Addr, error) {
	c, err := net.Dial(network, target)
	if err != nil {
		return netip.Addr{}, err
	}
	defer c.Close()
	ua, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok {
		return netip.Addr{}, errors.New("no UDP local address")
	}
	a, _ := netip.AddrFromSlice(ua.IP)
	a = a.Unmap()
	if a.IsLoopback() || a.IsUnspecified() {
		return netip.Addr{}, errors.New("no outbound route")
	}
	return a, nil
}
