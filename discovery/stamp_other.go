//go:build !linux

package discovery

import (
	"net"
	"syscall"
	"time"
)

// stampControl does nothing where receive timestamps are not used.
var stampControl func(network, address string, c syscall.RawConn) error

// readStamped reads into b (at least one byte) and returns when it did.
func readStamped(conn net.Conn, b []byte) (time.Time, error) { return readPlain(conn, b) }
