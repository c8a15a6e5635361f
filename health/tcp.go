package health

import (
	"context"
	"net"
	"net/netip"
	"time"
)

// tcpProbe returns the tcp check: the connection is accepted within timeout,
// then closed at once (an orderly close, so servers log nothing unusual).
// With source valid, probes go out from it (see dialer).
func tcpProbe(timeout time.Duration, source netip.Addr) probeFunc {
	plain := &net.Dialer{Timeout: timeout, KeepAlive: -1}
	return func(ctx context.Context, addr netip.AddrPort) result {
		d := plain
		if source.IsValid() {
			d = dialer(timeout, source, addr.Addr())
		}
		// Not d.DialTCP with a zero local address: that binds to port 0 before
		// connecting, which takes an ephemeral port per connection for all
		// destinations and runs out of them at a few thousand targets.
		conn, err := d.DialContext(ctx, "tcp", addr.String())
		if err != nil {
			return failure(netCause(err), err)
		}
		conn.Close()
		return result{cause: CauseOK}
	}
}
