package pgcluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/lock"
)

// redisTimeout bounds each dial to Redis, and redisIOTimeout each read and
// write, unless the URL sets its own, so that a dead or frozen Redis costs
// at most that per network step. Every caller bounds a whole call with its
// context, tighter: lock/ gives a call 500 ms, or more (up to
// lock.MaxCallTimeout) after Redis has been slow, so that a Redis slowed by
// a loaded machine is given time rather than taken for gone; a read
// timeout below that would cut the longer deadlines short.
const (
	redisTimeout   = 500 * time.Millisecond
	redisIOTimeout = lock.MaxCallTimeout
)

// redisPoolSize and redisPipelinePoolSize bound an instance's connections
// to Redis (to each master of a Redis Cluster), besides one for each
// subscription, unless the URL sets pool_size or pipeline_pool_size: a
// fleet's instances times these stay within Redis's listen backlog and
// maxclients (see setDefaults).
const (
	redisPoolSize         = 8
	redisPipelinePoolSize = 2
)

// redisForms is what a redis URL may look like, for error messages.
const redisForms = "write redis://[user:password@]host[:port][/db] (rediss:// for TLS), " +
	"redis-sentinel://host:port?master_name=NAME[&addr=host:port] or redis-cluster://host:port[?addr=host:port]"

// redisScheme is what a redis URL scheme means: the client to build, and the
// scheme go-redis's parser for that client takes.
type redisScheme struct {
	kind redisKind
	base string // "redis", or "rediss" for TLS
}

type redisKind int

const (
	redisSingle redisKind = iota
	redisSentinel
	redisCluster
)

var redisSchemes = map[string]redisScheme{
	"redis":           {redisSingle, "redis"},
	"rediss":          {redisSingle, "rediss"},
	"redis-sentinel":  {redisSentinel, "redis"},
	"rediss-sentinel": {redisSentinel, "rediss"},
	"redis-cluster":   {redisCluster, "redis"},
	"rediss-cluster":  {redisCluster, "rediss"},
}

// redisConfig is a redis URL parsed into the options of one of go-redis's
// clients: exactly one field is set.
type redisConfig struct {
	single   *redis.Options
	failover *redis.FailoverOptions
	cluster  *redis.ClusterOptions
}

// newRedisClient builds the client a redis URL names: redis:// and rediss://
// a single server, redis-sentinel:// and rediss-sentinel:// the master that
// Sentinel names, redis-cluster:// and rediss-cluster:// a Redis Cluster. It
// connects lazily, on the first command. Every client honours its callers'
// context deadlines (ContextTimeoutEnabled) and bounds each dial by
// redisTimeout, each read and write by redisIOTimeout, unless the URL sets
// its own.
func newRedisClient(rawURL string) (redis.UniversalClient, error) {
	rc, err := parseRedisURL(rawURL)
	if err != nil {
		return nil, err
	}
	switch {
	case rc.failover != nil:
		return redis.NewFailoverClient(rc.failover), nil
	case rc.cluster != nil:
		return redis.NewClusterClient(rc.cluster), nil
	default:
		return redis.NewClient(rc.single), nil
	}
}

// parseRedisURL parses a redis URL into client options, with the timeouts
// and context handling every Redis client of pgcluster has. It connects to
// nothing. Its errors never contain the URL's passwords.
func parseRedisURL(raw string) (redisConfig, error) {
	if !strings.Contains(raw, "://") {
		return redisConfig{}, errors.New(noSchemeWhy(raw))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return redisConfig{}, errors.New(badURLWhy(raw) + "; " + redisForms)
	}
	s, ok := redisSchemes[u.Scheme]
	switch {
	case !ok && strings.HasPrefix(raw[len(u.Scheme):], "://"):
		return redisConfig{}, fmt.Errorf("scheme %q is not redis, rediss, redis-sentinel, rediss-sentinel, redis-cluster or rediss-cluster; %s", u.Scheme, redisForms)
	case !ok:
		return redisConfig{}, errors.New("it is not a URL; " + redisForms)
	case u.Hostname() == "":
		return redisConfig{}, errors.New("no host; " + redisForms)
	case u.Fragment != "" || strings.HasSuffix(raw, "#"):
		return redisConfig{}, errors.New("it has a #fragment, which means nothing to Redis (percent-encode a # in a password as %23)")
	}
	if _, err := url.ParseQuery(u.RawQuery); err != nil {
		return redisConfig{}, errors.New("the query string is not valid: percent-encode % as %25 and & as %26 in its values")
	}
	// The scheme's length is the same whatever its case in raw.
	swapped := s.base + raw[len(u.Scheme):]
	var rc redisConfig
	switch s.kind {
	case redisSingle:
		rc.single, err = redis.ParseURL(swapped)
	case redisSentinel:
		rc.failover, err = parseSentinelURL(swapped)
	case redisCluster:
		rc.cluster, err = parseClusterURL(u.Path, swapped)
	}
	if err == nil {
		err = rc.checkAddrs()
	}
	if err == nil {
		err = rc.setDefaults()
	}
	if err != nil {
		return redisConfig{}, errors.New(scrub(strings.TrimPrefix(err.Error(), "redis: "), u))
	}
	return rc, nil
}

// checkAddrs refuses a server address whose port is not a port number:
// go-redis checks only that there is one.
func (rc redisConfig) checkAddrs() error {
	var addrs []string
	switch {
	case rc.single != nil:
		addrs = []string{rc.single.Addr}
	case rc.failover != nil:
		addrs = rc.failover.SentinelAddrs
	case rc.cluster != nil:
		addrs = rc.cluster.Addrs
	}
	for _, a := range addrs {
		_, port, err := net.SplitHostPort(a)
		if n, perr := strconv.ParseUint(port, 10, 16); err != nil || perr != nil || n == 0 {
			return fmt.Errorf("address %s: the port is not a number from 1 to 65535", a)
		}
	}
	return nil
}

// parseSentinelURL parses a Sentinel URL, its scheme already redis or
// rediss. The userinfo is the sentinels' credentials, ?username= and
// ?password= the master's.
func parseSentinelURL(raw string) (*redis.FailoverOptions, error) {
	o, err := redis.ParseFailoverURL(raw)
	if err != nil {
		return nil, err
	}
	if o.MasterName == "" {
		return nil, errors.New("no master_name: give ?master_name=NAME, the name the sentinels monitor")
	}
	if o.ReplicaOnly || o.RouteByLatency || o.RouteRandomly {
		return nil, errors.New("replica_only, route_by_latency and route_randomly send commands to replicas, whose leases and statuses lag the master's; leave them out")
	}
	return o, nil
}

// parseClusterURL parses a Redis Cluster URL, its scheme already redis or
// rediss, and path its path, which go-redis ignores.
func parseClusterURL(path, raw string) (*redis.ClusterOptions, error) {
	if p := strings.Trim(path, "/"); p != "" && p != "0" {
		return nil, fmt.Errorf("path %q: Redis Cluster has database 0 only", path)
	}
	o, err := redis.ParseClusterURL(raw)
	if err != nil {
		return nil, err
	}
	if o.ReadOnly || o.RouteByLatency || o.RouteRandomly {
		return nil, errors.New("read_only, route_by_latency and route_randomly send commands to replicas, whose leases and statuses lag the masters'; leave them out")
	}
	if o.TLSConfig != nil {
		o.TLSConfig.MinVersion = tls.VersionTLS12 // as go-redis sets for the other clients
	}
	return o, nil
}

// setDefaults turns on context deadlines (lock/ refuses a client without
// them), skips CLIENT SETINFO on connect, bounds the connections (see
// redisPoolSize) unless the URL sets their number, and bounds each dial by
// redisTimeout, each read and write by redisIOTimeout, unless the URL set
// its own. A URL may not turn a timeout off.
func (rc redisConfig) setDefaults() error {
	var ctxTimeout, noIdentity *bool
	var timeouts [3]*time.Duration
	var pools [2]*int
	switch {
	case rc.single != nil:
		o := rc.single
		ctxTimeout, noIdentity, timeouts = &o.ContextTimeoutEnabled, &o.DisableIdentity, [3]*time.Duration{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout}
		pools = [2]*int{&o.PoolSize, &o.PipelinePoolSize}
	case rc.failover != nil:
		o := rc.failover
		ctxTimeout, noIdentity, timeouts = &o.ContextTimeoutEnabled, &o.DisableIdentity, [3]*time.Duration{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout}
		pools = [2]*int{&o.PoolSize, &o.PipelinePoolSize}
	case rc.cluster != nil:
		o := rc.cluster
		ctxTimeout, noIdentity, timeouts = &o.ContextTimeoutEnabled, &o.DisableIdentity, [3]*time.Duration{&o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout}
		pools = [2]*int{&o.PoolSize, &o.PipelinePoolSize}
	}
	*ctxTimeout = true
	// Connections per client: go-redis's default is 10 a CPU, plus 10
	// for pipelines. 40 instances started together on 2 cores could each
	// open 30 a client at once; while Redis waited for CPU their dials
	// overflowed its listen backlog (tcp-backlog, 511) and timed out
	// (dial tcp: i/o timeout), the cause named by most of the instances
	// that went local then. And 300 instances on 16 cores would be
	// allowed 50,000 and more, against Redis's maxclients (10,000). An
	// instance's calls are short and few at a time.
	for i, d := range []int{redisPoolSize, redisPipelinePoolSize} {
		if *pools[i] == 0 {
			*pools[i] = d
		}
	}
	// A new connection's first call waits for the handshake's round trips
	// (HELLO, then CLIENT SETINFO naming the library) under the call's own
	// deadline. On a machine whose Redis answers slowly (a fleet started
	// together on a few cores) each round trip counts: a call that runs
	// out of time closes its connection, the next call dials again, and
	// the handshake is paid again. The library's name in CLIENT LIST is
	// not worth a round trip on every connection.
	*noIdentity = true
	for i, name := range []string{"dial_timeout", "read_timeout", "write_timeout"} {
		switch d := timeouts[i]; {
		case *d == 0 && i == 0:
			*d = redisTimeout
		case *d == 0:
			*d = redisIOTimeout
		case *d < 0:
			return fmt.Errorf("%s: 0 or less turns the timeout off, and a frozen Redis would then hold every call; give a positive duration such as 500ms", name)
		}
	}
	return nil
}

// badURLWhy says why url.Parse refused raw, without repeating the user or
// password: it parses raw again with everything up to the last @ after the
// scheme replaced.
func badURLWhy(raw string) string {
	redacted := raw
	if i := strings.Index(raw, "://"); i >= 0 {
		if at := strings.LastIndex(raw[i:], "@"); at >= 0 {
			redacted = raw[:i+3] + "user" + raw[i+at:]
		}
	}
	_, err := url.Parse(redacted)
	var ue *url.Error
	switch {
	case err == nil:
		return "the user or password is not valid in a URL: percent-encode its reserved characters (% as %25, @ as %40, : as %3A, / as %2F, ? as %3F, # as %23)"
	case errors.As(err, &ue):
		// Its quotes hold part of the URL: a port cut from a password
		// by a # that began a Corefile comment, for example.
		return "it is not a URL: " + quoted.ReplaceAllString(ue.Err.Error(), "")
	default:
		return "it is not a URL"
	}
}

var quoted = regexp.MustCompile(` ?"[^"]*"`)

// hostPort matches a host or IP address, with a port or not: what a
// redis URL without a scheme may be repeated as.
var hostPort = regexp.MustCompile(`^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]+)?$`)

// noSchemeWhy answers a redis URL written without a scheme, as redis-cli
// takes an address (host:port), with the URL to write. The text is
// repeated only when it is an address alone: anything else may hold a
// password (user:password@host, password=...).
func noSchemeWhy(raw string) string {
	if !hostPort.MatchString(raw) {
		return "it has no scheme: write redis:// before it (rediss:// for TLS)"
	}
	return "it has no scheme: write redis://" + raw + " (rediss://" + raw + " for TLS)"
}

// scrub replaces the passwords of u, as written and decoded, in msg.
func scrub(msg string, u *url.URL) string {
	var secrets []string
	if u.User != nil {
		if p, ok := u.User.Password(); ok {
			secrets = append(secrets, p, url.QueryEscape(p), url.PathEscape(p))
		}
	}
	for _, p := range u.Query()["password"] {
		secrets = append(secrets, p, url.QueryEscape(p))
	}
	for _, s := range secrets {
		if s != "" {
			msg = strings.ReplaceAll(msg, s, "xxxxx")
		}
	}
	return msg
}

// redisLog sends go-redis's own messages (a dial that failed, a pool
// reconnecting) to the debug log: while Redis is away it repeats them
// several times a second, and the one line that matters, the switch to
// local mode, is the coordinator's.
type redisLog struct{}

func (redisLog) Printf(_ context.Context, format string, v ...any) {
	log.Debugf("go-redis: "+format, v...)
}

func init() { redis.SetLogger(redisLog{}) }
