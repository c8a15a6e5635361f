package discovery

import (
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/miekg/dns"
)

// LookupFunc returns a pgconn.LookupFunc for the watched name that asks no
// DNS server: it returns the current candidates that answered the last
// probe round, fastest first (see Rank), or the one candidate of an answer
// of one, unprobed (there is nothing to rank, and the connection finds out
// whether it answers). With no candidate it first waits for a fresh
// resolution; when none answers it reports the error, so the Watcher
// resolves again. After an error that makes the answer out of date (see
// ReportError) it first waits for the resolution that error asked for.
// During a Pool's read-write fallback (see WatchOptions.ReadWriteFallback)
// it returns one of the cluster's serving nodes instead (see
// fallbackLookup). Other names go through the Client's LookupFunc.
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
		v := w.view.Load()
		if w.fallbackOn(v) {
			return w.fallbackLookup(v)
		}
		if cs := v.answer.Candidates; len(cs) == 1 {
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

// fallbackLookup returns where a new connection goes during the read-write
// fallback of v: a serving node seen to take writes, else one no other
// connection of the Pool waits on (see scout.pick); without a scout, every
// serving node in answer order. When a connection waits on each node, it
// fails at once: the connection to be handed out is on its way.
func (w *Watcher) fallbackLookup(v *view) ([]string, error) {
	cands := v.fallback.Candidates
	if len(cands) == 0 {
		err := fmt.Errorf("%w for %s (primary %s) nor for %s", ErrNoAddress, w.name, v.state.Status, w.cluster)
		w.ReportError(err)
		return nil, err
	}
	if w.scout == nil {
		return addrStrings(probedAll(cands)), nil
	}
	addrs, saw := w.scout.pick(cands)
	if addrs != nil {
		return addrs, nil
	}
	err := fmt.Errorf("discovery: none of the %d serving nodes of %s takes writes yet (primary %s): %s: %w",
		len(cands), w.cluster, v.state.Status, saw, pgconn.ErrReadOnlyConnection)
	w.ReportError(err)
	return nil, err
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
		if err != nil {
			if ap, perr := netip.ParseAddrPort(addr); perr == nil {
				w.scout.refused(netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
			}
			if ctx.Err() == nil {
				w.ReportError(err)
			}
		}
		return conn, err
	}
}
