package test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// chaosBackend is a TCP listener standing for a node of the chaos run, on
// an address of its own, that remembers when it went down and up: what an
// answer holding its address is judged against. Without a target it
// closes what it accepts (enough for check tcp); with one, it forwards
// each connection there, a real PostgreSQL server, so that every probe of
// check postgres and every role session is a real one.
type chaosBackend struct {
	host, port string
	target     string // host:port each connection is forwarded to; "" for none

	mu      sync.Mutex
	l       net.Listener
	conns   map[net.Conn]struct{} // both ends of each forwarded connection
	changes []chaosChange         // in time order; the first is the opening
}

// chaosChange is a backend going up or down. For a backend going down, at
// is when its listener was closed (every connection refused from then on);
// for one coming up, when it listened again.
type chaosChange struct {
	at time.Time
	up bool
}

// chaosForwardDial bounds a forwarder's connect to its target.
const chaosForwardDial = 5 * time.Second

func openChaosBackend(host, target string) (*chaosBackend, error) {
	b := &chaosBackend{host: host, target: target, conns: map[net.Conn]struct{}{}}
	if err := b.listen(host + ":0"); err != nil {
		return nil, err
	}
	_, b.port, _ = net.SplitHostPort(b.l.Addr().String())
	return b, nil
}

func (b *chaosBackend) listen(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("backend %s: listen: %w", addr, err)
	}
	b.mu.Lock()
	b.l = l
	b.changes = append(b.changes, chaosChange{at: time.Now(), up: true})
	b.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if b.target == "" {
				c.Close()
				continue
			}
			go b.forward(l, c)
		}
	}()
	return nil
}

// forward copies c to a new connection to the target and back until
// either side closes, or the backend goes down (down closes both).
func (b *chaosBackend) forward(l net.Listener, c net.Conn) {
	s, err := net.DialTimeout("tcp", b.target, chaosForwardDial)
	if err != nil {
		c.Close()
		return
	}
	b.mu.Lock()
	if b.l != l { // down since c was accepted: a down host keeps nothing open
		b.mu.Unlock()
		c.Close()
		s.Close()
		return
	}
	b.conns[c], b.conns[s] = struct{}{}, struct{}{}
	b.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range [][2]net.Conn{{c, s}, {s, c}} {
		wg.Go(func() {
			io.Copy(p[0], p[1])
			// One side ended: the session is over for both.
			c.Close()
			s.Close()
		})
	}
	wg.Wait()
	b.mu.Lock()
	delete(b.conns, c)
	delete(b.conns, s)
	b.mu.Unlock()
}

// down closes the listener, and every forwarded connection, as a host that
// goes down does: connections are refused from now on, and a role session
// through it ends.
func (b *chaosBackend) down() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.l == nil {
		return
	}
	b.l.Close()
	b.l = nil
	for c := range b.conns {
		c.Close()
	}
	clear(b.conns)
	b.changes = append(b.changes, chaosChange{at: time.Now(), up: false})
}

// up listens again on the same address and port.
func (b *chaosBackend) up() error { return b.listen(net.JoinHostPort(b.host, b.port)) }

// stateAt returns whether b was up at t and since when it had been so
// (its last change at or before t).
func (b *chaosBackend) stateAt(t time.Time) (up bool, since time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := len(b.changes) - 1; i >= 0; i-- {
		if c := b.changes[i]; !c.at.After(t) {
			return c.up, c.at
		}
	}
	return false, time.Time{}
}

// changedIn reports whether b changed state in (from, to].
func (b *chaosBackend) changedIn(from, to time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.changes {
		if c.at.After(from) && !c.at.After(to) {
			return true
		}
	}
	return false
}

// downs returns the times b went down, and when each ended (zero while it
// still is).
func (b *chaosBackend) downs() (from, to []time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, c := range b.changes {
		if c.up {
			continue
		}
		from = append(from, c.at)
		end := time.Time{}
		if i+1 < len(b.changes) {
			end = b.changes[i+1].at
		}
		to = append(to, end)
	}
	return from, to
}

func (b *chaosBackend) close() { b.down() }

// flapPair takes one backend of a pair down at a time, for a while, then
// brings it back, until stop is closed: the other of the pair stays up, so
// the cluster never has every node down (all_down would answer them all).
// It returns how many flaps it made; a backend that cannot listen again
// ends it with the error.
func flapPair(pair [2]*chaosBackend, stop <-chan struct{}) (int, error) {
	wait := func(lo, hi time.Duration) bool {
		t := time.NewTimer(lo + rand.N(hi-lo))
		defer t.Stop()
		select {
		case <-stop:
			return false
		case <-t.C:
			return true
		}
	}
	flaps := 0
	for {
		if !wait(time.Second, 3*time.Second) {
			return flaps, nil
		}
		b := pair[rand.N(2)]
		b.down()
		flaps++
		stopped := !wait(1500*time.Millisecond, 4*time.Second)
		if err := b.up(); err != nil {
			return flaps, err
		}
		if stopped {
			return flaps, nil
		}
	}
}

// chaosRoleBook is what primary. and standby. answers are judged against:
// when each node of cluster pgc held each role.
type chaosRoleBook interface {
	// holds reports whether host held role ("primary" or "standby") at
	// some time in [from, to].
	holds(host, role string, from, to time.Time) bool
	// vacant reports whether no node held role at some time in [from, to]:
	// an answer without an address is right then.
	vacant(role string, from, to time.Time) bool
	// switching reports whether t falls within a planned switchover.
	switching(t time.Time) bool
	// changes returns the times the primary role left a node, that node,
	// and when it may be primary again (zero after the last).
	changes() (at []time.Time, old []string, next []time.Time)
}

// chaosRoles is the primary./standby. cluster of the chaos run with check
// tcp: two nodes whose roles the run swaps in the registry, and when each
// was primary. One node holds each role at every moment.
type chaosRoles struct {
	hosts [2]string

	mu   sync.Mutex
	eras []roleEra
}

// roleEra is a time node held the primary role: from just before the
// UPDATE that gave it (the change may show from then on) to just after the
// COMMIT of the one that took it away (zero while it holds it).
type roleEra struct {
	primary      int
	since, until time.Time
}

func newChaosRoles(hosts [2]string) *chaosRoles {
	return &chaosRoles{hosts: hosts, eras: []roleEra{{primary: 0, since: time.Now()}}}
}

// swap gives the primary role to the standby and the standby role to the
// primary, in one statement, records when, and returns the new primary's
// address.
func (r *chaosRoles) swap(ctx context.Context, pg *pgtest.Postgres) (string, error) {
	before := time.Now()
	err := pg.Exec(ctx, "UPDATE pgcluster_nodes SET role = CASE role WHEN 'primary' THEN 'standby' ELSE 'primary' END WHERE cluster = 'pgc'")
	after := time.Now()
	if err != nil {
		return "", fmt.Errorf("swap the roles of cluster pgc: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	last := &r.eras[len(r.eras)-1]
	last.until = after
	r.eras = append(r.eras, roleEra{primary: 1 - last.primary, since: before})
	return r.hosts[1-last.primary], nil
}

// holds reports whether host held role ("primary" or "standby") at some
// time in [from, to].
func (r *chaosRoles) holds(host, role string, from, to time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, e := range r.eras {
		node := e.primary
		if role == "standby" {
			node = 1 - node
		}
		if r.hosts[node] != host || e.since.After(to) {
			continue
		}
		if e.until.IsZero() || !e.until.Before(from) {
			return true
		}
	}
	return false
}

// vacant is false: a swap hands each role over in one statement.
func (r *chaosRoles) vacant(string, time.Time, time.Time) bool { return false }

// switching is false: the registry swaps roles, no server stops.
func (r *chaosRoles) switching(time.Time) bool { return false }

// changes returns the times the roles were swapped (each COMMIT), the
// host that lost the primary role each time, and when the next swap
// began (zero after the last): from then on that host may be primary
// again.
func (r *chaosRoles) changes() (at []time.Time, old []string, next []time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, e := range r.eras {
		if e.until.IsZero() {
			continue
		}
		at = append(at, e.until)
		old = append(old, r.hosts[e.primary])
		n := time.Time{}
		if i+2 < len(r.eras) {
			n = r.eras[i+2].since
		}
		next = append(next, n)
	}
	return at, old, next
}
