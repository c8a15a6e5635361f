//go:build !linux

package health

import "syscall"

// bindNoPort does nothing where IP_BIND_ADDRESS_NO_PORT does not exist.
func bindNoPort(network, address string, c syscall.RawConn) error { return nil }
