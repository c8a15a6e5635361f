package health

import (
	"context"
	"net"
	"net/netip"
	"time"
)

// dialer is the dialer of a probe to addr: with source set and of addr's
// family, the connection goes out from source (a host with several
// addresses, of which the backends allow one), without binding a port
// before the connect where the system can (bindNoPort), so that probes
// from a source share ephemeral ports across destinations as unbound ones
// do; a source of the other family is not used.
func dialer(timeout time.Duration, source netip.Addr, addr netip.Addr) *net.Dialer {
	d := &net.Dialer{Timeout: timeout, KeepAlive: -1}
	if source.IsValid() && source.Is4() == addr.Unmap().Is4() {
		d.LocalAddr = &net.TCPAddr{IP: source.AsSlice()}
		d.Control = bindNoPort
	}
	return d
}

// dial connects to address (host:port) as dialer does for addr.
func dial(ctx context.Context, timeout time.Duration, source, addr netip.Addr, network, address string) (net.Conn, error) {
	return dialer(timeout, source, addr).DialContext(ctx, network, address)
}
