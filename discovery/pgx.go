package discovery

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// lookupReuse is how long LookupFunc and DialContext reuse a discovery
// result: long enough to serve both attempts of one connect under
// sslmode=prefer and a pool opening many connections at once, short enough
// to notice a node going away.
const lookupReuse = time.Second

// lookupKey identifies a discovery result.
type lookupKey struct {
	name           string
	port, fallback uint16
}

// LookupFunc returns a pgconn.LookupFunc that resolves a host through the
// cluster's DNS — never the operating system's resolver — probes its
// candidates and returns the reachable ones as "ip:port", fastest first;
// pgconn tries them in that order. An IP address is returned unchanged. A
// result is reused for up to a second (less when its TTL is shorter), and
// concurrent lookups of one name share one resolution and one probe round.
func (c *Client) LookupFunc() pgconn.LookupFunc { return c.lookupFunc(c.defaultPort) }

func (c *Client) lookupFunc(fallback uint16) pgconn.LookupFunc {
	return func(ctx context.Context, host string) ([]string, error) {
		if _, err := netip.ParseAddr(host); err == nil {
			return []string{host}, nil
		}
		res, err := c.cachedDiscover(ctx, host, fallback)
		if err != nil {
			return nil, err
		}
		return addrStrings(res.Ranking.Reachable()), nil
	}
}

// cachedDiscover is Discover through the Client's short-lived cache.
func (c *Client) cachedDiscover(ctx context.Context, host string, fallback uint16) (Result, error) {
	keep := func(r Result) time.Duration { return min(lookupReuse, r.TTL) }
	return c.lookups.get(ctx, lookupKey{host, c.port, fallback}, keep, func(ctx context.Context) (Result, error) {
		return c.discover(ctx, host, c.port, fallback)
	})
}

// ConfigureConn makes cfg find its hosts through the Client: LookupFunc for
// cfg and its fallbacks, with cfg.Port as the port of nodes found without
// SRV records (unless Config.Port is set), and a DialFunc that forgets the
// cached result when a connection attempt fails.
func (c *Client) ConfigureConn(cfg *pgconn.Config) {
	cfg.LookupFunc = c.lookupFunc(cfg.Port)
	dial := cfg.DialFunc
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		if err != nil {
			c.lookups.reset()
		}
		return conn, err
	}
}

// Connect is pgx.ConnectConfig for connString with ConfigureConn applied:
// postgres://app@prod.pgcluster.lan/db connects to the fastest node of prod.
func (c *Client) Connect(ctx context.Context, connString string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	c.ConfigureConn(&cfg.Config)
	return pgx.ConnectConfig(ctx, cfg)
}

// DialContext connects to addr, "host:port" or "host", through the Client:
// a host name is resolved and probed like LookupFunc does (the port of addr
// is used for nodes found without SRV records) and the reachable
// candidates are tried fastest first. It has the signature of
// net.Dialer.DialContext, for drivers and tools that accept one.
func (c *Client) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		host, portStr = addr, ""
	}
	fallback := c.defaultPort
	if p, err := strconv.ParseUint(portStr, 10, 16); err == nil {
		fallback = uint16(p)
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return d.DialContext(ctx, network, net.JoinHostPort(host, strconv.Itoa(int(fallback))))
	}
	res, err := c.cachedDiscover(ctx, host, fallback)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, p := range res.Ranking.Reachable() {
		conn, err := d.DialContext(ctx, network, p.Addr.String())
		if err == nil {
			return conn, nil
		}
		errs = append(errs, err)
	}
	c.lookups.reset()
	if len(errs) == 0 {
		return nil, fmt.Errorf("discovery: %s: %w", host, ErrUnreachable)
	}
	return nil, &joined{what: "candidates", errs: errs}
}

// addrStrings returns the addresses of r as "ip:port".
func addrStrings(r Ranking) []string {
	out := make([]string, len(r))
	for i, p := range r {
		out[i] = p.Addr.String()
	}
	return out
}
