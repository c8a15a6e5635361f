package discovery

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// ErrClosed is returned by a Watcher's methods after Close.
var ErrClosed = errors.New("discovery: watcher closed")

// Watcher keeps what a name resolves to current and reports every change.
// It resolves the name again when the answer's TTL runs out, when
// WatchOptions.Interval passes, when the caller reports an error or asks
// for it, and when the answer for the primary's name changes. A failed
// resolution keeps the previous answer. It is safe for concurrent use.
type Watcher struct {
	c         *Client
	name      string
	primary   string
	port      uint16
	fallback  uint16
	opts      WatchOptions
	writer    bool   // name is primary.CLUSTER
	readState bool   // a Pool of primary.CLUSTER: the primary's state is read
	readWrite bool   // and fallback connections are checked read-write
	cluster   string // the serving nodes of name's cluster, for the fallback
	scout     *scout // what the fallback's connections share, for a Pool with it on

	view       atomic.Pointer[view]
	nudges     chan Reason
	urgent     chan Reason  // a resolution at the floor, see urge
	hurryUntil atomic.Int64 // Unix nanoseconds, see hurrying
	cancel     context.CancelFunc
	done       chan struct{}
	ranks      memo[struct{}, Ranking]

	mu       sync.Mutex
	started  uint64        // resolutions of the name begun
	finished uint64        // and completed
	lastErr  error         // of the last completed one
	progress chan struct{} // closed and replaced when one completes
	stale    uint64        // LookupFunc waits until finished reaches it
}

// view is one immutable state of the Watcher.
type view struct {
	answer  Answer
	set     map[netip.AddrPort]bool
	primary Answer
	// state is the primary's state read with answer, when the Watcher
	// serves a Pool of primary.CLUSTER.
	state PrimaryState
	// fallback holds the cluster's serving nodes while state calls for
	// the fallback.
	fallback    Answer
	fallbackSet map[netip.AddrPort]bool
}

// Watch resolves name and keeps it current until Close. ctx bounds only the
// first resolution, which must succeed (a name with no address is a success:
// the Watcher starts empty and waits for nodes to appear). A name CheckName
// refuses, and intervals below MinWatchInterval, are refused.
func (c *Client) Watch(ctx context.Context, name string, opts WatchOptions) (*Watcher, error) {
	return c.watch(ctx, name, c.port, c.defaultPort, opts)
}

// watch is Watch with the port settings of resolve.
func (c *Client) watch(ctx context.Context, name string, port, fallback uint16, opts WatchOptions) (*Watcher, error) {
	if err := opts.check(); err != nil {
		return nil, err
	}
	if err := CheckName(name); err != nil {
		return nil, err
	}
	if _, err := netip.ParseAddr(name); err != nil {
		name = dns.Fqdn(name)
	}
	opts = opts.withDefaults()
	w := &Watcher{
		c:        c,
		name:     name,
		port:     port,
		fallback: fallback,
		opts:     opts,
		writer:   isWriterName(name),
		nudges:   make(chan Reason, 1),
		urgent:   make(chan Reason, 1),
		done:     make(chan struct{}),
		progress: make(chan struct{}),
	}
	w.primary = opts.primaryName(w.name)
	w.readState = w.writer && opts.pool
	w.readWrite = w.readState && opts.ReadWriteFallback == ReadWriteFallbackOn
	w.cluster = clusterOf(w.name)
	if w.readWrite {
		w.scout = newScout()
	}
	ans, st, err := w.resolveName(ctx)
	if err != nil {
		return nil, err
	}
	v := &view{answer: ans, set: setOf(ans), state: st}
	v.fallback, v.fallbackSet = w.resolveFallback(ctx, st, nil)
	var perr error
	if w.primary != "" {
		v.primary, perr = w.resolve(ctx, w.primary)
	}
	w.view.Store(v)
	runCtx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go w.run(runCtx, perr)
	return w, nil
}

// resolve resolves name; having no address is an answer, not an error.
func (w *Watcher) resolve(ctx context.Context, name string) (Answer, error) {
	ans, err := w.c.resolve(ctx, name, w.port, w.fallback)
	if errors.Is(err, ErrNoAddress) {
		return ans, nil
	}
	return ans, err
}

// Name returns the watched name, fully qualified.
func (w *Watcher) Name() string { return w.name }

// Answer returns the current answer.
func (w *Watcher) Answer() Answer { return w.view.Load().answer }

// Candidates returns the current candidates.
func (w *Watcher) Candidates() []Candidate {
	return append([]Candidate(nil), w.view.Load().answer.Candidates...)
}

// PrimaryState returns the primary's state as pgcluster's TXT record last
// said it. It is read only for a Pool of primary.CLUSTER (at each
// resolution, and every WatchOptions.StateInterval between them);
// otherwise it is PrimaryUnknown.
func (w *Watcher) PrimaryState() PrimaryState { return w.view.Load().state }

// Primary returns the current answer for the primary's name; it is empty
// when the primary is not watched.
func (w *Watcher) Primary() []Candidate {
	return append([]Candidate(nil), w.view.Load().primary.Candidates...)
}

// Contains reports whether addr is in the current answer.
func (w *Watcher) Contains(addr netip.AddrPort) bool {
	return w.view.Load().set[netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())]
}

// Rank returns the current candidates ranked by a probe round. The ranking
// is computed when first asked for after each resolution or reported error,
// and shared by concurrent callers. The error wraps ErrNoAddress when there
// is no candidate and ErrUnreachable when none answered.
func (w *Watcher) Rank(ctx context.Context) (Ranking, error) {
	keep := func(Ranking) time.Duration { return w.opts.Interval }
	return w.ranks.get(ctx, struct{}{}, keep, func(ctx context.Context) (Ranking, error) {
		cands := w.view.Load().answer.Candidates
		if len(cands) == 0 {
			return nil, fmt.Errorf("%w for %s", ErrNoAddress, w.name)
		}
		r := w.c.Rank(ctx, cands)
		if _, ok := r.Best(); !ok {
			return r, unreachable(w.name, r, len(cands)-len(r))
		}
		return r, nil
	})
}

// ReportError tells the Watcher that using one of its candidates failed
// (a connection error, a read-only primary): it forgets its ranking and
// resolves again, as soon as MinInterval allows for most errors, and
// sooner for those of a switchover:
//
//   - SQLSTATE 57P01, 57P02, 57P03 (the server shuts down, crashed, or
//     cannot take connections now) and 25006 (read_only_sql_transaction:
//     no longer the primary);
//   - about the primary (the watched name is primary.CLUSTER, or the
//     error names an address of the primary's answer): a connection
//     refused, reset or cut short (EOF), a pooled connection lost, a
//     server found read-only, or no reachable address.
//
// The first resolution for such an error goes out at once, unless one went
// out less than MinWatchInterval ago; while they keep coming, and for 5 s
// after the last, the Watcher resolves at MinWatchInterval,
// also when the answer has no address. However many connections report
// errors, it resolves at most once per MinWatchInterval. A nil err is
// ignored.
//
// The SQLSTATEs above mean the answer itself is out of date — the node is
// leaving or no longer the primary, and a probe cannot tell — so until that
// resolution completes, LookupFunc waits for it rather than send new
// connections back to the node.
func (w *Watcher) ReportError(err error) {
	if err == nil {
		return
	}
	kind := w.classify(err)
	if kind.stale {
		w.mu.Lock()
		w.stale = max(w.stale, w.started+1)
		w.mu.Unlock()
	}
	w.ranks.reset()
	if kind.switchover {
		w.urge(ReasonError)
		return
	}
	w.nudge(ReasonError)
}

// Refresh resolves the name again and waits for the outcome, which it
// returns; on failure the previous answer is kept. During a switchover
// (see ReportError) the resolution goes out at MinWatchInterval, otherwise
// at MinInterval after the last one.
func (w *Watcher) Refresh(ctx context.Context) error {
	w.mu.Lock()
	target := w.started + 1
	w.mu.Unlock()
	if w.hurrying() {
		w.signalUrgent(ReasonRefresh)
	} else {
		w.nudge(ReasonRefresh)
	}
	resErr, err := w.await(ctx, target)
	if err != nil {
		return err
	}
	return resErr
}

// awaitFresh waits until no resolution asked for by a read-only error is
// pending. Its outcome does not matter: a failed one keeps the answer.
func (w *Watcher) awaitFresh(ctx context.Context) error {
	w.mu.Lock()
	target := w.stale
	w.mu.Unlock()
	_, err := w.await(ctx, target)
	return err
}

// await waits until the resolution numbered target has completed and
// returns its outcome, or why it stopped waiting.
func (w *Watcher) await(ctx context.Context, target uint64) (outcome, err error) {
	for {
		w.mu.Lock()
		if w.finished >= target {
			outcome := w.lastErr
			w.mu.Unlock()
			return outcome, nil
		}
		ch := w.progress
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-w.done:
			return nil, ErrClosed
		}
	}
}

// Close stops the Watcher and waits for its goroutine to end. OnEvent is not
// called after Close returns.
func (w *Watcher) Close() {
	w.cancel()
	<-w.done
}

// nudge asks the loop to resolve again; a nudge already pending covers it.
func (w *Watcher) nudge(r Reason) {
	select {
	case w.nudges <- r:
	default:
	}
}

// setOf returns the addresses of ans as a set.
func setOf(ans Answer) map[netip.AddrPort]bool {
	set := make(map[netip.AddrPort]bool, len(ans.Candidates))
	for _, c := range ans.Candidates {
		set[c.Addr] = true
	}
	return set
}
