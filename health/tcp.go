package health

import (
	"context"
	"net"
	"net/netip"
	"time"
)

// tcpProbe returns the tcp check: the connection is accepted within timeout,
// then closed at once (an orderly close, so servers log nothing unusual).
func tcpProbe(timeout time.Duration) probeFunc {
	d := &net.Dialer{Timeout: timeout, KeepAlive: -1}
	return func(ctx context.Context, addr netip.AddrPort) result {
		conn, err := d.DialTCP(ctx, "tcp", netip.AddrPort{}, addr)
		if err != nil {
			return failure(netCause(err), err)
		}
		conn.Close()
		return result{cause: CauseOK}
	}
}
