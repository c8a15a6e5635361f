package discovery

import (
	"context"
	"net"
	"net/netip"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/miekg/dns"
)

// ReadWriteFallback tells whether a Pool for primary.CLUSTER finds the new
// primary itself in the moment between an old primary leaving and DNS
// naming the new one (see WatchOptions.ReadWriteFallback).
type ReadWriteFallback int

const (
	// ReadWriteFallbackOn, the default: while pgcluster's TXT record at
	// primary.CLUSTER says "state=held", "state=none" or
	// "state=fail_open", new connections go to the serving nodes of
	// CLUSTER, each checked read-write (SHOW transaction_read_only, as
	// libpq's target_session_attrs=read-write) before the pool hands it
	// out: a connection to a node in recovery waits there until the node
	// takes writes, and the pool keeps one waiting on each node, so it
	// writes on a newly promoted primary as soon as it accepts writes.
	// Never while the record names a serving primary, never in a split
	// brain, never without the record (an older pgcluster).
	ReadWriteFallbackOn ReadWriteFallback = iota
	// ReadWriteFallbackOff: connections go where DNS's answer says, and
	// nowhere while it has no address.
	ReadWriteFallbackOff
)

// resolveName resolves the watched name and, when the Watcher serves a
// Pool of primary.CLUSTER, reads the primary's state in TXT alongside.
func (w *Watcher) resolveName(ctx context.Context) (Answer, PrimaryState, error) {
	if !w.readState {
		ans, err := w.resolve(ctx, w.name)
		return ans, PrimaryState{}, err
	}
	var (
		wg  sync.WaitGroup
		txt []dns.RR
	)
	wg.Go(func() { txt = w.c.primaryTXT(ctx, w.name) })
	ans, err := w.resolve(ctx, w.name)
	wg.Wait()
	return ans, parsePrimaryState(txt, len(ans.Candidates)), err
}

// resolveFallback resolves the cluster's serving nodes when st calls for
// the fallback, and returns them with their set. When that fails, the
// fallback of old, if it was on, is kept.
func (w *Watcher) resolveFallback(ctx context.Context, st PrimaryState, old *view) (Answer, map[netip.AddrPort]bool) {
	if !w.readWrite || !st.between() {
		return Answer{}, nil
	}
	ans, err := w.resolve(ctx, w.cluster)
	if err != nil {
		if old != nil && w.fallbackOn(old) {
			return old.fallback, old.fallbackSet
		}
		return Answer{}, nil
	}
	return ans, setOf(ans)
}

// fallbackOn reports whether new connections of v go to the cluster's
// serving nodes, checked read-write.
func (w *Watcher) fallbackOn(v *view) bool { return w.readWrite && v.state.between() }

// served returns the addresses a Pool keeps connections to in v: the
// cluster's serving nodes during the fallback, the answer otherwise.
func (w *Watcher) served(v *view) map[netip.AddrPort]bool {
	if w.fallbackOn(v) {
		return v.fallbackSet
	}
	return v.set
}

// needsReadWriteCheck reports whether a new connection to addr must prove
// that it takes writes before the Pool hands it out: it was made through
// the fallback, or to an address no longer in the answer.
func (w *Watcher) needsReadWriteCheck(addr netip.AddrPort) bool {
	v := w.view.Load()
	return w.readWrite && (w.fallbackOn(v) || !v.set[addr])
}

// validateConnect wraps validate (which may be nil) with the read-write
// check of connections made through the fallback: during it, a connection
// to a serving node waits there until the node takes writes (see
// awaitWritable).
func (w *Watcher) validateConnect(validate pgconn.ValidateConnectFunc) pgconn.ValidateConnectFunc {
	return func(ctx context.Context, pc *pgconn.PgConn) error {
		if addr, ok := remoteAddr(pc.Conn()); ok && w.needsReadWriteCheck(addr) {
			var err error
			if v := w.view.Load(); w.scout != nil && w.fallbackOn(v) && v.fallbackSet[addr] {
				err = w.awaitWritable(ctx, pc, addr)
			} else {
				err = pgconn.ValidateConnectTargetSessionAttrsReadWrite(ctx, pc)
			}
			if err != nil {
				return err
			}
		}
		if validate != nil {
			return validate(ctx, pc)
		}
		return nil
	}
}

// remoteAddr returns the peer of a TCP connection, its address unmapped.
func remoteAddr(c net.Conn) (netip.AddrPort, bool) {
	ta, ok := c.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, false
	}
	ap := ta.AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
}

// lost reports whether an address of old is not in cur.
func lost(old, cur map[netip.AddrPort]bool) bool {
	for a := range old {
		if !cur[a] {
			return true
		}
	}
	return false
}
