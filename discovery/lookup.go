package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// SRVPrefix is prepended to a name to ask for the ports of its nodes.
const SRVPrefix = "_postgresql._tcp."

// ErrNoAddress is returned when a name resolves to no address at all. The
// error also wraps ErrNoSuchName or ErrNoData when the DNS answer tells
// which.
var ErrNoAddress = errors.New("discovery: no address")

var (
	// ErrNoSuchName is wrapped with ErrNoAddress when the name does not
	// exist (NXDOMAIN): a typing error, or a cluster or alias not (or no
	// longer) in the zone.
	ErrNoSuchName = errors.New("no such name (NXDOMAIN)")
	// ErrNoData is wrapped with ErrNoAddress when the name exists but has
	// no address (NODATA): for example a cluster none of whose nodes
	// serves, or primary.CLUSTER while no node, or two, claim to be primary.
	ErrNoData = errors.New("name exists but has no address")
)

// MaxUnglued is the most SRV targets of one answer whose addresses are
// asked for separately, when the server did not send them with the SRV
// records (in the additional section, as pgcluster does); further targets
// without addresses are left out and counted in Answer.Unresolved. At most
// ungluedParallel of them are asked at a time.
const MaxUnglued = 8

// ungluedParallel bounds the SRV targets resolved at the same time.
const ungluedParallel = 4

// Candidate is one address a name resolved to.
type Candidate struct {
	// Addr is where the node listens.
	Addr netip.AddrPort
	// Host is the SRV target the address belongs to (the node's own name),
	// or the canonical name when the address came from an A or AAAA answer.
	Host string
	// Priority is its SRV record's priority (0 from an A or AAAA answer):
	// the lower, the sooner it is tried (RFC 2782). pgcluster's topology
	// gives a client's own zone 0, its region 10, the rest 20.
	Priority uint16
}

// String returns the candidate's address as "ip:port".
func (c Candidate) String() string { return c.Addr.String() }

// Answer is what a name resolved to.
type Answer struct {
	// Name is the name asked, fully qualified.
	Name string
	// Canonical is the name at the end of its CNAME chain.
	Canonical string
	// Candidates are the addresses, without duplicates, in answer order.
	Candidates []Candidate
	// TTL is the smallest TTL of the records used (CNAMEs, SRV, A, AAAA),
	// or the negative-caching TTL when there are none.
	TTL time.Duration
	// SRV tells whether the ports came from SRV records.
	SRV bool
	// Truncated tells that the DNS answer used carried the TC bit even over
	// TCP: the server sent part of the set (a cluster bigger than one
	// answer), and the candidates are that part.
	Truncated bool
	// Unresolved counts the SRV targets left out because the server sent
	// no address for them and MaxUnglued others were already asked for.
	Unresolved int
}

// Resolve asks DNS for the nodes behind name. Unless the Client has a fixed
// Port, it first looks for SRV records at _postgresql._tcp.NAME, then at
// _postgresql._tcp.CANONICAL when NAME is a CNAME, and takes each node's port
// from them, with the targets' addresses sent along (at most MaxUnglued
// targets without them are asked for); without SRV records the A and AAAA
// addresses of name are used with the default port. An IP literal resolves
// to itself; a name CheckName refuses is refused before any query. A failed
// query fails the whole resolution rather than giving a partial answer; a
// name that does not exist, or has no address, gives an empty Answer and
// ErrNoAddress, with ErrNoSuchName (NXDOMAIN) or ErrNoData.
func (c *Client) Resolve(ctx context.Context, name string) (Answer, error) {
	return c.resolve(ctx, name, c.port, c.defaultPort)
}

// resolve is Resolve with the port settings given: port, when not 0, for
// every candidate (no SRV); fallback for A and AAAA candidates otherwise.
func (c *Client) resolve(ctx context.Context, name string, port, fallback uint16) (Answer, error) {
	if ip, err := netip.ParseAddr(name); err == nil {
		addr := netip.AddrPortFrom(ip.Unmap(), cmp.Or(port, fallback))
		return Answer{Name: name, Canonical: name, Candidates: []Candidate{{Addr: addr, Host: name}}}, nil
	}
	if err := CheckName(name); err != nil {
		return Answer{Name: name, Canonical: name}, err
	}
	name = dns.Fqdn(name)
	a4, a6, srv, err := c.ask(ctx, name, port == 0)
	if err != nil {
		return Answer{Name: name, Canonical: name}, err
	}
	canonical := a4.canonical
	if port == 0 {
		if len(srv.rrs) == 0 && canonical != name {
			if srv, err = c.resolver.lookup(ctx, SRVPrefix+canonical, dns.TypeSRV); err != nil {
				return Answer{Name: name, Canonical: canonical}, err
			}
		}
		if len(srv.rrs) > 0 {
			return c.fromSRV(ctx, name, canonical, srv)
		}
		port = fallback
	}
	ans := Answer{Name: name, Canonical: canonical, TTL: ttlOf(min(a4.ttl, a6.ttl)), Truncated: a4.truncated || a6.truncated}
	var u uniq
	for _, rr := range append(a4.rrs, a6.rrs...) {
		if ip, ok := addrOf(rr); ok {
			ans.Candidates = u.append(ans.Candidates, Candidate{Addr: netip.AddrPortFrom(ip, port), Host: canonical})
		}
	}
	if len(ans.Candidates) == 0 {
		return ans, noAddress(name, canonical, a4.rcode)
	}
	return ans, nil
}

// noAddress tells why name (canonical at the end of its CNAME chain) has no
// address, from the rcode of the answer for the canonical name.
func noAddress(name, canonical string, rcode int) error {
	why := ErrNoData
	if rcode == dns.RcodeNameError {
		why = ErrNoSuchName
	}
	if !equalName(name, canonical) {
		return fmt.Errorf("%w for %s (alias of %s): %w", ErrNoAddress, name, canonical, why)
	}
	return fmt.Errorf("%w for %s: %w", ErrNoAddress, name, why)
}

// ask sends the A, AAAA and (when withSRV) SRV queries for name in
// parallel; any failure fails them all, and the first is returned.
func (c *Client) ask(ctx context.Context, name string, withSRV bool) (a4, a6, srv rrset, err error) {
	var (
		wg           sync.WaitGroup
		e4, e6, esrv error
	)
	wg.Go(func() { a4, e4 = c.resolver.lookup(ctx, name, dns.TypeA) })
	wg.Go(func() { a6, e6 = c.resolver.lookup(ctx, name, dns.TypeAAAA) })
	if withSRV {
		wg.Go(func() { srv, esrv = c.resolver.lookup(ctx, SRVPrefix+name, dns.TypeSRV) })
	}
	wg.Wait()
	for _, err = range []error{e4, e6, esrv} {
		if err != nil {
			break
		}
	}
	return a4, a6, srv, err
}

// fromSRV turns SRV records into candidates, taking the targets' addresses
// from the additional section when the server sent them and asking for the
// others, at most MaxUnglued of them, ungluedParallel at a time.
func (c *Client) fromSRV(ctx context.Context, name, canonical string, srv rrset) (Answer, error) {
	ans := Answer{Name: name, Canonical: canonical, SRV: true, Truncated: srv.truncated}
	ttl := srv.ttl
	glue := make(map[string][]dns.RR)
	for _, x := range srv.extra {
		if _, ok := addrOf(x); ok {
			owner := dns.CanonicalName(x.Header().Name)
			glue[owner] = append(glue[owner], x)
		}
	}
	type target struct {
		srv   *dns.SRV
		addrs []netip.Addr
		ttl   uint32
		err   error
	}
	var targets, unglued []*target
	for _, rr := range srv.rrs {
		s := rr.(*dns.SRV)
		if s.Target == "." {
			continue // "service decidedly not available" (RFC 2782)
		}
		t := &target{srv: s, ttl: math.MaxUint32}
		for _, x := range glue[dns.CanonicalName(s.Target)] {
			ip, _ := addrOf(x)
			t.addrs = append(t.addrs, ip)
			t.ttl = min(t.ttl, x.Header().Ttl)
		}
		if len(t.addrs) == 0 {
			if len(unglued) == MaxUnglued {
				ans.Unresolved++
				continue
			}
			unglued = append(unglued, t)
		}
		targets = append(targets, t)
	}
	// The lowest priority first (RFC 2782): with MaxProbes fewer than the
	// targets, the nearest are the ones probed.
	slices.SortStableFunc(targets, func(a, b *target) int { return cmp.Compare(a.srv.Priority, b.srv.Priority) })
	var wg sync.WaitGroup
	slots := make(chan struct{}, ungluedParallel)
	for _, t := range unglued {
		wg.Go(func() {
			slots <- struct{}{}
			defer func() { <-slots }()
			t.addrs, t.ttl, t.err = c.addresses(ctx, t.srv.Target)
		})
	}
	wg.Wait()
	var u uniq
	for _, t := range targets {
		if t.err != nil {
			return ans, t.err
		}
		ttl = min(ttl, t.ttl)
		for _, ip := range t.addrs {
			ans.Candidates = u.append(ans.Candidates, Candidate{Addr: netip.AddrPortFrom(ip, t.srv.Port), Host: t.srv.Target, Priority: t.srv.Priority})
		}
	}
	ans.TTL = ttlOf(ttl)
	if len(ans.Candidates) == 0 {
		return ans, fmt.Errorf("%w for %s: %w (its SRV records name no target with an address)", ErrNoAddress, name, ErrNoData)
	}
	return ans, nil
}

// addresses returns the A and AAAA addresses of host and their smallest TTL.
func (c *Client) addresses(ctx context.Context, host string) ([]netip.Addr, uint32, error) {
	var (
		wg     sync.WaitGroup
		a4, a6 rrset
		e4, e6 error
	)
	wg.Go(func() { a4, e4 = c.resolver.lookup(ctx, host, dns.TypeA) })
	wg.Go(func() { a6, e6 = c.resolver.lookup(ctx, host, dns.TypeAAAA) })
	wg.Wait()
	if e4 != nil {
		return nil, 0, e4
	}
	if e6 != nil {
		return nil, 0, e6
	}
	var ips []netip.Addr
	for _, rr := range append(a4.rrs, a6.rrs...) {
		if ip, ok := addrOf(rr); ok {
			ips = append(ips, ip)
		}
	}
	return ips, min(a4.ttl, a6.ttl), nil
}

// addrOf returns the address of an A or AAAA record.
func addrOf(rr dns.RR) (netip.Addr, bool) {
	var ip netip.Addr
	var ok bool
	switch v := rr.(type) {
	case *dns.A:
		ip, ok = netip.AddrFromSlice(v.A.To4())
	case *dns.AAAA:
		ip, ok = netip.AddrFromSlice(v.AAAA)
	}
	return ip.Unmap(), ok
}

// uniq drops candidates whose address was already appended.
type uniq map[netip.AddrPort]bool

// append appends c to cs unless its address is already there.
func (u *uniq) append(cs []Candidate, c Candidate) []Candidate {
	if *u == nil {
		*u = make(uniq)
	}
	if (*u)[c.Addr] {
		return cs
	}
	(*u)[c.Addr] = true
	return append(cs, c)
}

// ttlOf converts a TTL in seconds; MaxUint32 (nothing seen) becomes 0.
func ttlOf(s uint32) time.Duration {
	if s == math.MaxUint32 {
		return 0
	}
	return time.Duration(s) * time.Second
}
