package discovery

import (
	"fmt"
	"time"
)

const (
	// DefaultPort is the port of candidates found without SRV records.
	DefaultPort = 5432
	// DefaultProbeTimeout bounds one probe round.
	DefaultProbeTimeout = time.Second
	// DefaultMaxProbes is how many candidates one probe round measures at
	// most: the first ones of the answer (which pgcluster rotates, so
	// clients spread over a big cluster).
	DefaultMaxProbes = 32
)

// Config configures a Client. The zero value asks the system's nameservers,
// reads ports from SRV records and probes with a PostgreSQL SSLRequest.
type Config struct {
	// Servers are DNS servers asked directly, each "host:port" or "host"
	// (port 53), in order, failing over from one to the next. Empty means
	// the nameservers of ResolvConf.
	Servers []string
	// ResolvConf is the file read when Servers is empty; DefaultResolvConf
	// when empty.
	ResolvConf string
	// DNSTimeout bounds one query to one server; DefaultDNSTimeout when zero
	// (the resolv.conf timeout for the system's nameservers).
	DNSTimeout time.Duration
	// Port, when set, is the port of every candidate, and SRV records are
	// not asked for.
	Port uint16
	// DefaultPort is the port of A and AAAA candidates when the name has no
	// SRV records; DefaultPort when zero.
	DefaultPort uint16
	// Prober measures candidates; PostgresProbe when nil.
	Prober Prober
	// ProbeTimeout bounds one probe round: every candidate is probed in
	// parallel, and one that has not answered by then is unreachable.
	// DefaultProbeTimeout when zero.
	ProbeTimeout time.Duration
	// MaxProbes is how many candidates one probe round measures at most,
	// the first ones of the answer; the others are not probed and not
	// ranked (Result.NotProbed counts them). DefaultMaxProbes when zero;
	// negative is refused.
	MaxProbes int
}

// Client resolves cluster names and ranks their nodes. It is safe for
// concurrent use.
type Client struct {
	resolver     *Resolver
	port         uint16
	defaultPort  uint16
	prober       Prober
	probeTimeout time.Duration
	maxProbes    int
	lookups      memo[lookupKey, Result]
}

// New returns a Client for cfg.
func New(cfg Config) (*Client, error) {
	if cfg.MaxProbes < 0 {
		return nil, fmt.Errorf("discovery: Config.MaxProbes %d: want a positive number (0 means %d)", cfg.MaxProbes, DefaultMaxProbes)
	}
	var (
		r   *Resolver
		err error
	)
	if len(cfg.Servers) > 0 {
		r, err = NewResolver(cfg.Servers, cfg.DNSTimeout)
	} else {
		r, err = SystemResolver(cfg.ResolvConf, cfg.DNSTimeout)
	}
	if err != nil {
		return nil, err
	}
	c := &Client{
		resolver:     r,
		port:         cfg.Port,
		defaultPort:  cfg.DefaultPort,
		prober:       cfg.Prober,
		probeTimeout: cfg.ProbeTimeout,
		maxProbes:    cfg.MaxProbes,
	}
	if c.maxProbes == 0 {
		c.maxProbes = DefaultMaxProbes
	}
	if c.defaultPort == 0 {
		c.defaultPort = DefaultPort
	}
	if c.prober == nil {
		c.prober = PostgresProbe
	}
	if c.probeTimeout <= 0 {
		c.probeTimeout = DefaultProbeTimeout
	}
	return c, nil
}

// Resolver returns the DNS resolver the Client asks.
func (c *Client) Resolver() *Resolver { return c.resolver }
