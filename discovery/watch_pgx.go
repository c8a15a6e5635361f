package discovery

import (
	"context"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/miekg/dns"
)

// LookupFunc returns a pgconn.LookupFunc for the watched name that asks no
// DNS server: it returns the current candidates that answered the last
// probe round, fastest first (see Rank). With no candidate it first waits
// for a fresh resolution; when none answers it reports the error, so the
// Watcher resolves again. After a read-only error (see ReportError) it
// first waits for the resolution that error asked for. Other names go
// through the Client's LookupFunc.
func (w *Watcher) LookupFunc() pgconn.LookupFunc {
	other := w.c.lookupFunc(w.fallback)
	return func(ctx context.Context, host string) ([]string, error) {
		if !equalName(dns.Fqdn(host), w.name) {
			return other(ctx, host)
		}
		if err := w.awaitFresh(ctx); err != nil {
			return nil, err
		}
		if len(w.view.Load().answer.Candidates) == 0 {
			if err := w.Refresh(ctx); err != nil {
				return nil, err
			}
		}
		r, err := w.Rank(ctx)
		if err != nil {
			w.ReportError(err)
			return nil, err
		}
		return addrStrings(r.Reachable()), nil
	}
}

// DialFunc wraps dial (net.Dialer.DialContext when nil) so that a failed
// connection attempt is reported to the Watcher.
func (w *Watcher) DialFunc(dial pgconn.DialFunc) pgconn.DialFunc {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil && ctx.Err() == nil {
			w.ReportError(err)
		}
		return conn, err
	}
}
