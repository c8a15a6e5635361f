package discovery

import (
	"context"
	"fmt"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/miekg/dns"
)

// LookupFunc returns a pgconn.LookupFunc for the watched name that asks no
// DNS server: it returns the current candidates that answered the last
// probe round, fastest first (see Rank), or the one candidate of an answer
// of one, unprobed (there is nothing to rank, and the connection finds out
// whether it answers). With no candidate it first waits for a fresh
// resolution; when none answers it reports the error, so the
// Watcher resolves again. After an error that makes the answer out of
// date (see ReportError) it first waits for the resolution that error
// asked for. During a Pool's read-write fallback (see
// WatchOptions.ReadWriteFallback) it returns the cluster's serving nodes
// instead, unprobed, for the Pool to check. Other names go through the
// Client's LookupFunc.
func (w *Watcher) LookupFunc() pgconn.LookupFunc {
	other := w.c.lookupFunc(w.fallback)
	return func(ctx context.Context, host string) ([]string, error) {
		if !equalName(dns.Fqdn(host), w.name) {
			return other(ctx, host)
		}
		if err := w.awaitFresh(ctx); err != nil {
			return nil, err
		}
		if len(w.targets(w.view.Load())) == 0 {
			if err := w.Refresh(ctx); err != nil {
				return nil, err
			}
		}
		if v := w.view.Load(); w.fallbackOn(v) {
			if len(v.fallback.Candidates) == 0 {
				err := fmt.Errorf("%w for %s (primary %s) nor for %s", ErrNoAddress, w.name, v.state.Status, w.cluster)
				w.ReportError(err)
				return nil, err
			}
			return addrStrings(probedAll(v.fallback.Candidates)), nil
		}
		if cs := w.view.Load().answer.Candidates; len(cs) == 1 {
			return []string{cs[0].Addr.String()}, nil
		}
		r, err := w.Rank(ctx)
		if err != nil {
			w.ReportError(err)
			return nil, err
		}
		return addrStrings(r.Reachable()), nil
	}
}

// targets returns the candidates new connections of v go to: the
// fallback's during the read-write fallback, the answer's otherwise.
func (w *Watcher) targets(v *view) []Candidate {
	if w.fallbackOn(v) {
		return v.fallback.Candidates
	}
	return v.answer.Candidates
}

// probedAll returns cs as a Ranking, in their order, as if all answered.
func probedAll(cs []Candidate) Ranking {
	r := make(Ranking, len(cs))
	for i, c := range cs {
		r[i] = Probed{Candidate: c}
	}
	return r
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
