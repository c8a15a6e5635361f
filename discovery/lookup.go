package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// SRVPrefix is prepended to a name to ask for the ports of its nodes.
const SRVPrefix = "_postgresql._tcp."

// ErrNoAddress is returned when a name resolves to no address at all.
var ErrNoAddress = errors.New("discovery: no address")

// Candidate is one address a name resolved to.
type Candidate struct {
	// Addr is where the node listens.
	Addr netip.AddrPort
	// Host is the SRV target the address belongs to (the node's own name),
	// or the canonical name when the address came from an A or AAAA answer.
	Host string
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
}

// Resolve asks DNS for the nodes behind name. Unless the Client has a fixed
// Port, it first looks for SRV records at _postgresql._tcp.NAME, then at
// _postgresql._tcp.CANONICAL when NAME is a CNAME, and takes each node's port
// from them; without SRV records the A and AAAA addresses of name are used
// with the default port. An IP literal resolves to itself. A failed query
// fails the whole resolution rather than giving a partial answer; a name
// that does not exist, or has no address, gives an empty Answer and
// ErrNoAddress.
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
	ans := Answer{Name: name, Canonical: canonical, TTL: ttlOf(min(a4.ttl, a6.ttl))}
	for _, rr := range append(a4.rrs, a6.rrs...) {
		if ip, ok := addrOf(rr); ok {
			ans.Candidates = appendUnique(ans.Candidates, Candidate{Addr: netip.AddrPortFrom(ip, port), Host: canonical})
		}
	}
	if len(ans.Candidates) == 0 {
		return ans, fmt.Errorf("%w for %s", ErrNoAddress, name)
	}
	return ans, nil
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
// others, all in parallel.
func (c *Client) fromSRV(ctx context.Context, name, canonical string, srv rrset) (Answer, error) {
	ans := Answer{Name: name, Canonical: canonical, SRV: true}
	ttl := srv.ttl
	type target struct {
		srv   *dns.SRV
		addrs []netip.Addr
		ttl   uint32
		err   error
	}
	targets := make([]*target, 0, len(srv.rrs))
	var wg sync.WaitGroup
	for _, rr := range srv.rrs {
		s := rr.(*dns.SRV)
		if s.Target == "." {
			continue // "service decidedly not available" (RFC 2782)
		}
		t := &target{srv: s, ttl: math.MaxUint32}
		targets = append(targets, t)
		for _, x := range srv.extra {
			if ip, ok := addrOf(x); ok && equalName(x.Header().Name, s.Target) {
				t.addrs = append(t.addrs, ip)
				t.ttl = min(t.ttl, x.Header().Ttl)
			}
		}
		if len(t.addrs) == 0 {
			wg.Go(func() { t.addrs, t.ttl, t.err = c.addresses(ctx, s.Target) })
		}
	}
	wg.Wait()
	for _, t := range targets {
		if t.err != nil {
			return ans, t.err
		}
		ttl = min(ttl, t.ttl)
		for _, ip := range t.addrs {
			ans.Candidates = appendUnique(ans.Candidates, Candidate{Addr: netip.AddrPortFrom(ip, t.srv.Port), Host: t.srv.Target})
		}
	}
	ans.TTL = ttlOf(ttl)
	if len(ans.Candidates) == 0 {
		return ans, fmt.Errorf("%w for %s", ErrNoAddress, name)
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

// appendUnique appends c unless its address is already in cs.
func appendUnique(cs []Candidate, c Candidate) []Candidate {
	for _, x := range cs {
		if x.Addr == c.Addr {
			return cs
		}
	}
	return append(cs, c)
}

// ttlOf converts a TTL in seconds; MaxUint32 (nothing seen) becomes 0.
func ttlOf(s uint32) time.Duration {
	if s == math.MaxUint32 {
		return 0
	}
	return time.Duration(s) * time.Second
}
