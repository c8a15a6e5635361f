package discovery

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// During a Pool's read-write fallback each new connection goes to one of
// the cluster's serving nodes and, once connected, waits there until the
// node takes writes, asking it every scoutPoll with the check the Pool's
// connections pass (SHOW transaction_read_only). A session stays open
// across its server's promotion, so the connection waiting on the standby
// that is promoted is handed out within scoutPoll of it leaving recovery,
// without a connection made after it. The Pool keeps one connection
// waiting on each serving node (see warmer); the scout is what they share:
// which node was seen to take writes, and which has a connection on its
// way or waiting, so that they spread over the nodes.

const (
	// scoutPoll is how often a waiting connection asks its node whether it
	// takes writes: a query on an open session, tens to hundreds of
	// microseconds of the server's time, against a new connection's tens
	// of milliseconds.
	scoutPoll = 20 * time.Millisecond
	// scoutClaim is how long a node counts as covered by a connection on
	// its way there, until it waits there: the connection's dial and
	// start-up.
	scoutClaim = time.Second
	// scoutHandOff bounds how long new connections stay away from a node
	// seen to take writes while the connection the Pool's warmer made
	// there is on its way into the Pool: one made anew would wait for its
	// start-up, after the promotion, while that one sits idle.
	scoutHandOff = 100 * time.Millisecond
)

// scoutVerdict is what the last connection waiting on a node saw.
type scoutVerdict int8

const (
	scoutUnknown  scoutVerdict = iota // nothing yet
	scoutReadOnly                     // in recovery, or read-only
	scoutWritable                     // takes writes
)

// scout is shared by a Pool's connections during the fallback. Its methods
// do nothing, or report nothing seen, on a nil scout (a Watcher that
// serves no Pool, or one with the fallback off).
type scout struct {
	mu      sync.Mutex
	nodes   map[netip.AddrPort]*scoutNode
	changed chan struct{} // closed and replaced when a node is seen to take writes, or left
}

// scoutNode is what the scout knows of one serving node.
type scoutNode struct {
	verdict      scoutVerdict
	waiting      int       // connections waiting on it
	claimedUntil time.Time // a connection is on its way until then
	handingUntil time.Time // the Pool's own connection to it is on its way into the Pool until then
}

func newScout() *scout {
	return &scout{nodes: make(map[netip.AddrPort]*scoutNode), changed: make(chan struct{})}
}

// track forgets the nodes not in cands, the fallback's serving nodes; nil
// (the fallback ended) forgets them all, so that a later fallback starts
// afresh.
func (s *scout) track(cands []Candidate) {
	if s == nil {
		return
	}
	keep := setOf(Answer{Candidates: cands})
	s.mu.Lock()
	defer s.mu.Unlock()
	for addr := range s.nodes {
		if !keep[addr] {
			delete(s.nodes, addr)
		}
	}
	s.signal()
}

// signal wakes the waiting connections. Called with s.mu held.
func (s *scout) signal() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// node returns addr's entry, made when absent. Called with s.mu held.
func (s *scout) node(addr netip.AddrPort) *scoutNode {
	n := s.nodes[addr]
	if n == nil {
		n = &scoutNode{}
		s.nodes[addr] = n
	}
	return n
}

// pick chooses where a new connection goes among cands, the fallback's
// nodes, in their order: the nodes seen to take writes; else the first
// node no connection waits on or is on its way to, which it claims; else
// none, with what it saw for the error. A node seen to take writes whose
// waiting connection the Pool is taking in (see warmer) is none either:
// the Acquire that fails finds that connection idle when made again.
func (s *scout) pick(cands []Candidate) (addrs []string, saw string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	var writable, handing []string
	var uncovered *Candidate
	readOnly := 0
	for i, c := range cands {
		n := s.nodes[c.Addr]
		switch {
		case n != nil && n.verdict == scoutWritable && now.Before(n.handingUntil):
			handing = append(handing, c.Addr.String())
		case n != nil && n.verdict == scoutWritable:
			writable = append(writable, c.Addr.String())
		case n != nil && (n.waiting > 0 || now.Before(n.claimedUntil)):
			if n.verdict == scoutReadOnly {
				readOnly++
			}
		case uncovered == nil:
			uncovered = &cands[i]
		}
	}
	switch {
	case len(writable) > 0:
		return writable, ""
	case len(handing) > 0:
		return nil, fmt.Sprintf("%s takes writes, its connection is being handed to the pool", handing[0])
	case uncovered != nil:
		s.node(uncovered.Addr).claimedUntil = now.Add(scoutClaim)
		return []string{uncovered.Addr.String()}, ""
	}
	return nil, fmt.Sprintf("a connection waits on each (%d seen read-only)", readOnly)
}

// refused forgets what was seen of addr and the claim on it: a connection
// to it could not be made, so it neither takes writes nor has a
// connection on its way.
func (s *scout) refused(addr netip.AddrPort) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.nodes, addr)
}

// enter counts a connection waiting on addr; leave undoes it.
func (s *scout) enter(addr netip.AddrPort) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.node(addr)
	n.waiting++
	n.claimedUntil = time.Time{}
}

func (s *scout) leave(addr netip.AddrPort) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.nodes[addr]; n != nil {
		n.waiting--
		s.signal() // a node without a connection waiting on it
	}
}

// see records what a connection learnt of addr; a node seen to take
// writes wakes the connections waiting on the others. handing tells that
// the connection is the Pool's own (see warmer), on its way into the Pool.
func (s *scout) see(addr netip.AddrPort, v scoutVerdict, handing bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.node(addr)
	if handing {
		n.handingUntil = time.Now().Add(scoutHandOff)
	}
	if n.verdict == v {
		return
	}
	n.verdict = v
	if v == scoutWritable {
		s.signal()
	}
}

// handed tells that the Pool's own connection to addr is in the Pool.
func (s *scout) handed(addr netip.AddrPort) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := s.nodes[addr]; n != nil {
		n.handingUntil = time.Time{}
	}
}

// writable returns a node of cands, other than but, seen to take writes,
// if any, and the channel closed at the next change.
func (s *scout) writable(cands []Candidate, but netip.AddrPort) (netip.AddrPort, bool, <-chan struct{}) {
	if s == nil {
		return netip.AddrPort{}, false, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range cands {
		if n := s.nodes[c.Addr]; c.Addr != but && n != nil && n.verdict == scoutWritable {
			return c.Addr, true, s.changed
		}
	}
	return netip.AddrPort{}, false, s.changed
}

// awaitWritable is the read-write check of a connection made through the
// fallback to addr: it returns nil once the node takes writes, asking it
// every scoutPoll meanwhile, and fails when another serving node is seen to
// take writes first (new connections go there), when the fallback ends
// (DNS names a primary, or a split brain), when the node breaks the
// session, or at ctx's end (the connection's connect_timeout).
func (w *Watcher) awaitWritable(ctx context.Context, pc *pgconn.PgConn, addr netip.AddrPort) error {
	s := w.scout
	s.enter(addr)
	defer s.leave(addr)
	tick := time.NewTicker(scoutPoll)
	defer tick.Stop()
	for {
		err := pgconn.ValidateConnectTargetSessionAttrsReadWrite(ctx, pc)
		switch {
		case err == nil:
			s.see(addr, scoutWritable, ctx.Value(warmKey{}) != nil)
			return nil
		case errors.Is(err, pgconn.ErrReadOnlyConnection):
			s.see(addr, scoutReadOnly, false)
		default:
			return err
		}
		v := w.view.Load()
		if !w.fallbackOn(v) {
			return fmt.Errorf("discovery: %s is read-only and the fallback ended (primary %s): %w", addr, v.state.Status, pgconn.ErrReadOnlyConnection)
		}
		other, ok, changed := s.writable(v.fallback.Candidates, addr)
		if ok {
			return fmt.Errorf("discovery: %s is read-only and %s takes writes: %w", addr, other, pgconn.ErrReadOnlyConnection)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("discovery: %s still read-only: %w", addr, context.Cause(ctx))
		case <-w.done:
			return ErrClosed
		case <-changed:
		case <-tick.C:
		}
	}
}
