package discovery

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// The SQLSTATEs a switchover produces: the old primary shuts down or
// crashes (its sessions get 57P01 or 57P02, new connections 57P03 while it
// stops or starts), or it was demoted (writes get 25006).
const (
	sqlStateAdminShutdown = "57P01"
	sqlStateCrashShutdown = "57P02"
	sqlStateCannotConnect = "57P03"
	sqlStateReadOnly      = "25006"
)

// primaryLabel is the first label of a name whose answer is the primary.
const primaryLabel = "primary"

// maxErrorDepth bounds how deep walkErrors looks into wrapped errors.
const maxErrorDepth = 16

// connLost is reported to the Watcher when a pooled connection broke.
type connLost struct{ addr netip.AddrPort }

func (e *connLost) Error() string {
	return fmt.Sprintf("discovery: pooled connection to %s lost", e.addr)
}

// errorKind is how the Watcher takes a reported error.
type errorKind struct {
	// switchover: the error is one a switchover produces, so the Watcher
	// resolves again at MinWatchInterval rather than MinInterval.
	switchover bool
	// stale: the answer itself is out of date (the node is shutting down
	// or no longer the primary), so LookupFunc waits for the resolution.
	stale bool
}

// classify tells what err means for the Watcher. SQLSTATEs of a switchover
// always count; a connection refused, reset or cut short (EOF), a pooled
// connection lost, a failed read-write check and a primary with no
// reachable address count when they are about the primary: the watched
// name is primary.CLUSTER, or the address is in the primary's answer.
func (w *Watcher) classify(err error) errorKind {
	var k errorKind
	walkErrors(err, 0, func(e error) {
		if pe, ok := e.(*pgconn.PgError); ok {
			switch pe.Code {
			case sqlStateAdminShutdown, sqlStateCrashShutdown, sqlStateCannotConnect, sqlStateReadOnly:
				k.switchover, k.stale = true, true
			}
		}
	})
	if !k.switchover && w.aboutPrimary(err) && connectionFailed(err) {
		k.switchover = true
	}
	return k
}

// connectionFailed reports whether err is a connection refused, reset or
// cut short, a pooled connection lost, a server found read-only, or no
// reachable address.
func connectionFailed(err error) bool {
	var lost *connLost
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &lost) ||
		errors.Is(err, pgconn.ErrReadOnlyConnection) || errors.Is(err, ErrUnreachable) ||
		errors.Is(err, ErrNoAddress)
}

// aboutPrimary reports whether err concerns the primary: the Watcher
// watches primary.CLUSTER, or the address in err is in the primary's
// answer.
func (w *Watcher) aboutPrimary(err error) bool {
	if w.writer {
		return true
	}
	addr, ok := errorAddr(err)
	if !ok {
		return false
	}
	for _, c := range w.view.Load().primary.Candidates {
		if c.Addr == addr {
			return true
		}
	}
	return false
}

// errorAddr returns the remote address an error names, if any.
func errorAddr(err error) (netip.AddrPort, bool) {
	var addr netip.AddrPort
	walkErrors(err, 0, func(e error) {
		switch e := e.(type) {
		case *net.OpError:
			if ta, ok := e.Addr.(*net.TCPAddr); ok && !addr.IsValid() {
				addr = ta.AddrPort()
			}
		case *connLost:
			if !addr.IsValid() {
				addr = e.addr
			}
		}
	})
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	return addr, addr.IsValid()
}

// walkErrors calls f on err and every error it wraps, down to a bounded
// depth (pgconn joins one error per host tried).
func walkErrors(err error, depth int, f func(error)) {
	if err == nil || depth > maxErrorDepth {
		return
	}
	f(err)
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		walkErrors(u.Unwrap(), depth+1, f)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			walkErrors(e, depth+1, f)
		}
	}
}

// isWriterName reports whether name's first label is primary: its answer
// is the one node that takes writes.
func isWriterName(name string) bool {
	first, _, _ := strings.Cut(name, ".")
	return strings.EqualFold(first, primaryLabel)
}

// clusterOf returns the name of every serving node of a primary's cluster:
// name without its first label (primary.prod.Z → prod.Z).
func clusterOf(name string) string {
	_, rest, _ := strings.Cut(name, ".")
	return rest
}
