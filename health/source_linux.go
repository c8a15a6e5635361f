package health

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// bindNoPort sets IP_BIND_ADDRESS_NO_PORT on a probe's socket bound to a
// source address: the port is chosen at connect, per destination, so that
// thousands of targets do not each take an ephemeral port of the source.
func bindNoPort(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_BIND_ADDRESS_NO_PORT, 1)
	})
	if err != nil {
		return err
	}
	return serr
}
