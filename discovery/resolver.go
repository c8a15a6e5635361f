package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

const (
	// DefaultDNSTimeout bounds one query to one DNS server.
	DefaultDNSTimeout = time.Second
	// DefaultDNSAttempts is how many times the list of servers is tried.
	DefaultDNSAttempts = 2
	// DefaultResolvConf is where the system's nameservers are read from.
	DefaultResolvConf = "/etc/resolv.conf"

	// udpSize is the EDNS0 buffer size advertised: the DNS flag day 2020
	// value, which avoids IP fragmentation.
	udpSize = 1232
)

// ErrNoServers is returned when no DNS server is configured.
var ErrNoServers = errors.New("discovery: no DNS server")

// Resolver sends queries straight to DNS servers over UDP, retries over TCP
// when an answer is truncated, and fails over between the servers in order.
// A server that answered last is asked first next time. It is safe for
// concurrent use.
type Resolver struct {
	servers   []string
	timeout   time.Duration
	attempts  int
	udp, tcp  *dns.Client
	preferred atomic.Int32
}

// NewResolver returns a Resolver asking servers, each "host:port" or "host"
// (port 53). A zero timeout means DefaultDNSTimeout.
func NewResolver(servers []string, timeout time.Duration) (*Resolver, error) {
	if len(servers) == 0 {
		return nil, ErrNoServers
	}
	if timeout <= 0 {
		timeout = DefaultDNSTimeout
	}
	addrs := make([]string, 0, len(servers))
	for _, s := range servers {
		a, err := ParseServer(s)
		if err != nil {
			return nil, err
		}
		addrs = append(addrs, a)
	}
	return &Resolver{
		servers:  addrs,
		timeout:  timeout,
		attempts: DefaultDNSAttempts,
		udp:      &dns.Client{Net: "udp", Timeout: timeout, UDPSize: udpSize},
		tcp:      &dns.Client{Net: "tcp", Timeout: timeout},
	}, nil
}

// SystemResolver returns a Resolver asking the nameservers listed in a
// resolv.conf file (DefaultResolvConf when path is empty). A zero timeout
// means the file's own "options timeout:" value.
func SystemResolver(path string, timeout time.Duration) (*Resolver, error) {
	if path == "" {
		path = DefaultResolvConf
	}
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("discovery: %w", err)
	}
	servers := make([]string, 0, len(cc.Servers))
	for _, s := range cc.Servers {
		servers = append(servers, net.JoinHostPort(s, cc.Port))
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("%w in %s", ErrNoServers, path)
	}
	if timeout <= 0 {
		timeout = time.Duration(cc.Timeout) * time.Second
	}
	r, err := NewResolver(servers, timeout)
	if err != nil {
		return nil, err
	}
	if cc.Attempts > 0 {
		r.attempts = cc.Attempts
	}
	return r, nil
}

// ParseServer turns "host", "host:port", "v6addr" or "[v6addr]:port" into a
// "host:port" address, port 53 by default. The port must be a number from 1
// to 65535.
func ParseServer(s string) (string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", errors.New("discovery: empty DNS server address; want host or host:port")
	}
	if _, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")); err == nil {
		return net.JoinHostPort(strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"), "53"), nil
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		if strings.Contains(s, ":") {
			return "", fmt.Errorf("discovery: bad DNS server address %q: want host, host:port or [ipv6]:port", s)
		}
		return net.JoinHostPort(s, "53"), nil
	}
	if host == "" {
		return "", fmt.Errorf("discovery: bad DNS server address %q: no host before the port", s)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return "", fmt.Errorf("discovery: bad DNS server address %q: port %q is not a number from 1 to 65535", s, port)
	}
	return s, nil
}

// Servers returns the servers asked, in order, as "host:port".
func (r *Resolver) Servers() []string { return append([]string(nil), r.servers...) }

// Query asks for name (made fully qualified) and qtype. The reply is returned
// when a server answers NOERROR or NXDOMAIN; any other outcome moves on to the
// next server.
func (r *Resolver) Query(ctx context.Context, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.RecursionDesired = true
	m.SetEdns0(udpSize, false)
	return r.Exchange(ctx, m)
}

// Exchange sends m to the servers in turn, starting with the one that last
// answered, until one gives a NOERROR or NXDOMAIN reply or every server has
// been tried the configured number of times.
func (r *Resolver) Exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	n := len(r.servers)
	start := int(r.preferred.Load())
	qerr := &QueryError{Name: m.Question[0].Name, Type: m.Question[0].Qtype}
	for i := range n * r.attempts {
		idx := (start + i) % n
		reply, err := r.exchangeOne(ctx, m, r.servers[idx])
		if err == nil {
			r.preferred.Store(int32(idx))
			return reply, nil
		}
		qerr.Errs = append(qerr.Errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, qerr
}

// QueryError tells why no server answered a query: one error per attempt.
type QueryError struct {
	// Name is the name asked.
	Name string
	// Type is the record type asked.
	Type uint16
	// Errs holds one error per server tried, in order.
	Errs []error
}

// Error tells on one line, of bounded length, why the attempts failed.
func (e *QueryError) Error() string {
	attempts := &joined{what: "attempts", errs: e.Errs}
	return fmt.Sprintf("discovery: %s %s: no answer: %s", e.Name, dns.TypeToString[e.Type], attempts)
}

// Unwrap returns the attempts' errors.
func (e *QueryError) Unwrap() []error { return e.Errs }

// exchangeOne asks one server over UDP, then over TCP when the reply is
// truncated. A TCP reply with the TC bit is a partial set (a cluster bigger
// than one message): it is used as it is, and the TC bit tells the caller.
func (r *Resolver) exchangeOne(ctx context.Context, m *dns.Msg, server string) (*dns.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	reply, _, err := r.udp.ExchangeContext(ctx, m, server)
	if err == nil && reply.Truncated {
		reply, _, err = r.tcp.ExchangeContext(ctx, m, server)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", server, err)
	}
	if reply.Rcode != dns.RcodeSuccess && reply.Rcode != dns.RcodeNameError {
		return nil, fmt.Errorf("%s: %s", server, dns.RcodeToString[reply.Rcode])
	}
	return reply, nil
}
