package pgcluster

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/plugin"
	clog "github.com/coredns/coredns/plugin/pkg/log"

	"github.com/pgcluster/pgcluster/lock"
)

var log = clog.NewWithPlugin("pgcluster")

// Defaults of the Corefile options.
const (
	defaultTTL     = 5
	defaultRefresh = 30 * time.Second
	// startupWait is how long start-up waits for the first registry load
	// before the server starts anyway (answering SERVFAIL in the zone, and
	// not ready, until the load succeeds).
	startupWait = 5 * time.Second
)

// Floors of the Corefile durations: below them an option would only burn CPU
// and load the database.
const (
	// minRefresh: each refresh is a full load of both tables. Notifications
	// already bring changes within milliseconds; the poll is a safety net.
	minRefresh = time.Second
	// minStaleAfter: heartbeats are written seconds apart, so a shorter limit
	// would take every node out between two heartbeats and rebuild the zone
	// continuously.
	minStaleAfter = time.Second
)

func init() { plugin.Register("pgcluster", setup) }

func setup(c *caddy.Controller) error {
	p, cfg, err := parse(c)
	if err != nil {
		return plugin.Error("pgcluster", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.OnStartup(func() error {
		// Every plugin's setup has run: bind has set the listen addresses.
		conf := dnsserver.GetConfig(c)
		if err := cacheAgrees(cfg, conf); err != nil {
			return plugin.Error("pgcluster", err)
		}
		cfg.instance = instanceName(hostName(), conf.ListenHosts, conf.Port)
		if p.start(ctx, cfg) {
			return nil // answering from the rows the instance before this one loaded
		}
		select {
		case <-p.loaded():
		case <-time.After(startupWait):
			log.Warningf("Registry not loaded after %s: starting anyway, not ready until it loads", startupWait)
		}
		return nil
	})
	c.OnShutdown(func() error {
		cancel()
		p.stop()
		return nil
	})
	dnsserver.GetConfig(c).AddPlugin(func(next plugin.Handler) plugin.Handler {
		p.Next = next
		return p
	})
	return nil
}

// cacheAgrees refuses a cache plugin in the server block of a topology
// that is not off: cache keys its entries on the name, type, class and the
// DO and CD bits alone, and answers before pgcluster, so one client's
// place would answer every client's.
func cacheAgrees(cfg *settings, conf *dnsserver.Config) error {
	if conf.Handler("cache") == nil {
		return nil
	}
	if cfg.segmented() && !cfg.topologyOn() {
		return fmt.Errorf("check_scope %s: the cache plugin of this server block answers before pgcluster and keys only on the name, type, class and DO/CD bits, so it would hand one %s's verdicts to every client; remove cache from the block, or set check_scope fleet", cfg.checkScope, cfg.checkScope)
	}
	if !cfg.topologyOn() {
		return nil
	}
	return fmt.Errorf("topology %s: the cache plugin of this server block answers before pgcluster and keys only on the name, type, class and DO/CD bits, so it would hand one place's answer to every client; remove cache from the block, or set topology off", cfg.topology)
}

// start begins following the registry. It reports whether it already
// answers, from the rows the instance it replaces (same DSN and zones, before
// a Corefile reload) last loaded.
func (p *PgCluster) start(ctx context.Context, cfg *settings) bool {
	cfg.resolveAddrs()
	if cfg.redisURL != "" {
		token, err := lock.NewToken()
		if err != nil {
			log.Errorf("Redis: %v", err)
		}
		cfg.token = token
	}
	pb, ch, done, err := startPublisher(ctx, cfg)
	if err != nil {
		// parse validated every option: only a bug gets here.
		log.Errorf("Health checks not started: %v", err)
	}
	p.pb, p.checksDone = pb, done
	if ch != nil {
		p.segs = ch.sg
		if cfg.passive && ch.sg == nil {
			p.passive = ch.passiveVerdicts
		}
	}
	key := storeKey(cfg.dsn, cfg.zones)
	if cfg.relayOn() {
		r, err := newRelay(cfg, pb, key)
		if err == nil {
			p.relay = r
			restored := r.restore()
			go r.run(ctx)
			return restored
		}
		// parse validated the URL: only a bug gets here.
		log.Errorf("Registry relay not started (%v): following PostgreSQL here", err)
	}
	p.reg = newRegistry(cfg, key, pb.applyAt)
	p.reg.mover = newAliasMover(cfg, pb.snap.Load, func() int64 { return 0 })
	restored := p.reg.restore()
	go p.reg.run(ctx)
	return restored
}

// startPublisher makes the publisher of cfg's zone, complete: with checks
// on, it is made with their sink and the checks are started, feeding it
// their Views until ctx is done; done is closed once they have stopped
// (nil without checks). When the checks cannot be made, the publisher
// answers without them, and err says why.
//
// ch is the checks (nil without); with check_scope zone or region, its sg
// answers each segment's clients with that segment's verdicts.
func startPublisher(ctx context.Context, cfg *settings) (pb *publisher, ch *checks, done <-chan struct{}, err error) {
	if !cfg.checksOn() {
		return newPublisher(cfg, nil, false), nil, nil, nil
	}
	ch, err = newChecks(cfg)
	if err != nil {
		return newPublisher(cfg, nil, false), nil, nil, err
	}
	pb = newPublisher(cfg, ch.setTargets, ch.waitView())
	if cfg.segmented() {
		sg := newSegmentation(cfg, pb)
		sg.follow = ch.follow
		ch.sg = sg
		pb.after = sg.rowsApplied
	}
	return pb, ch, ch.start(ctx, pb.setView), nil
}

// loaded is closed once the first rows are applied.
func (p *PgCluster) loaded() <-chan struct{} {
	if p.relay != nil {
		return p.relay.loaded
	}
	return p.reg.loaded
}

// stop waits for the registry goroutine, whose context is already cancelled.
func (p *PgCluster) stop() {
	if p.reg != nil {
		<-p.reg.done
	}
	if p.relay != nil {
		<-p.relay.done
	}
	if p.checksDone != nil {
		<-p.checksDone
	}
}

func parse(c *caddy.Controller) (*PgCluster, *settings, error) {
	cfg := &settings{ttl: defaultTTL, refresh: defaultRefresh, self: map[string]netip.Addr{},
		interval: defaultInterval, timeout: defaultTimeout, rise: defaultRise, fall: defaultFall, allDown: allDownOpen,
		splitBrain: splitBrainClosed, primaryHold: -1, relayGrace: defaultRelayGrace, probeBudget: probeBudgetDefault,
		topology: topologyOff, minLocal: defaultMinLocal, checkScope: scopeFleet}
	p := &PgCluster{}
	i := 0
	given := map[string]int{} // option → its line
	for c.Next() {
		if i > 0 {
			return nil, nil, plugin.ErrOnce
		}
		i++
		args := c.RemainingArgs()
		for _, z := range args {
			if why := badDomain(z); why != "" {
				return nil, nil, c.Errf("zone %q %s", z, why)
			}
		}
		cfg.zones = plugin.OriginsFromArgsOrServerBlock(args, c.ServerBlockKeys)
		if err := zonesOverlap(cfg.zones); err != nil {
			return nil, nil, c.Err(err.Error())
		}
		for c.NextBlock() {
			opt := c.Val()
			if given[opt] > 0 && opt != "self" && opt != "ns" {
				return nil, nil, c.Errf("%s: given twice; keep one %s line", opt, opt)
			}
			given[opt] = c.Line()
			if err := parseOption(c, cfg, p); err != nil {
				return nil, nil, err
			}
		}
	}
	if cfg.dsn == "" {
		return nil, nil, c.Err("missing required option 'postgres DSN'")
	}
	if err := checkOptionsAgree(cfg); err != nil {
		return nil, nil, c.Err(err.Error())
	}
	if err := redisOptionsAgree(c, cfg, given); err != nil {
		return nil, nil, err
	}
	if err := segmentOptionsAgree(cfg); err != nil {
		return nil, nil, c.Err(err.Error())
	}
	p.Zones = cfg.zones
	p.ttl = cfg.ttl
	p.failOpen = failOpenAnswers.WithLabelValues(cfg.zones[0])
	p.topo = newTopologyCounters(cfg)
	p.topology, p.minLocal = cfg.topology, cfg.minLocal
	return p, cfg, nil
}

func parseOption(c *caddy.Controller, cfg *settings, p *PgCluster) error {
	opt := c.Val()
	args := c.RemainingArgs()
	switch opt {
	case "postgres":
		if len(args) != 1 {
			return c.ArgErr()
		}
		if why := badDSN(args[0]); why != "" {
			return c.Errf("postgres: the DSN cannot be used: %s; write a libpq URL (postgres://user@host:5432/db?sslmode=verify-full) or key=value pairs (host=db port=5432 dbname=registry)", why)
		}
		cfg.dsn = args[0]
	case "ttl":
		if len(args) != 1 {
			return c.ArgErr()
		}
		t, err := strconv.ParseUint(args[0], 10, 32)
		if err != nil || t > 86400 {
			return c.Errf("ttl: %q is not a number of seconds from 0 to 86400", args[0])
		}
		cfg.ttl = uint32(t)
	case "refresh":
		if err := setDuration(&cfg.refresh, c, opt, args, minRefresh, false); err != nil {
			return err
		}
	case "stale_after":
		if err := setDuration(&cfg.staleAfter, c, opt, args, minStaleAfter, true); err != nil {
			return err
		}
	case "allow_loopback":
		if len(args) != 0 {
			return c.ArgErr()
		}
		cfg.allowLoopback = true
	case "self":
		return parseSelf(c, cfg, args)
	case "check", "interval", "timeout", "rise", "fall", "max_lag", "all_down", "role_interval", "split_brain", "primary_hold", "probe_budget":
		return parseCheckOption(c, cfg, opt, args)
	case "redis", "redis_prefix", "redis_secret":
		return parseRedisOption(c, cfg, opt, args)
	case "relay", "relay_grace":
		return parseRelayOption(c, cfg, opt, args)
	case "ns", "soa":
		return parseApexOption(c, cfg, opt, args)
	case "topology", "min_local":
		return parseTopologyOption(c, cfg, opt, args)
	case "location", "check_scope", "probe_source":
		return parseSegmentOption(c, cfg, opt, args)
	case "fallthrough":
		for _, z := range args {
			if why := badDomain(z); why != "" {
				return c.Errf("fallthrough: zone %q %s", z, why)
			}
		}
		p.Fall.SetZonesFromArgs(args)
	default:
		return c.Err(unknownOption(opt))
	}
	return nil
}

// parseSelf parses "self NODE [ADDRESS]". Each node may be named once; an
// ADDRESS must be one a remote client can connect to.
func parseSelf(c *caddy.Controller, cfg *settings, args []string) error {
	if len(args) < 1 || len(args) > 2 {
		return c.ArgErr()
	}
	// Registry names are served, and matched, in lower case.
	node := strings.ToLower(args[0])
	if why := badSelfNode(node); why != "" {
		return c.Errf("self: node %q %s", node, why)
	}
	if _, dup := cfg.self[node]; dup {
		return c.Errf("self %s: given twice; keep one self line per node", node)
	}
	var a netip.Addr
	if len(args) == 2 {
		var err error
		if a, err = netip.ParseAddr(args[1]); err != nil {
			return c.Errf("self %s: %q is not an IP address", node, args[1])
		}
		a = a.Unmap()
		if why := badSelfAddr(a); why != "" {
			return c.Errf("self %s: %s %s; give this host's address that clients reach, or no ADDRESS to use the outbound one", node, args[1], why)
		}
	}
	cfg.self[node] = a
	return nil
}

// setDuration parses a duration option of at least floor into dst; off
// allows "off" and 0, which set 0.
func setDuration(dst *time.Duration, c *caddy.Controller, opt string, args []string, floor time.Duration, off bool) error {
	if len(args) != 1 {
		return c.ArgErr()
	}
	if off && (args[0] == "off" || args[0] == "0") {
		*dst = 0
		return nil
	}
	d, err := time.ParseDuration(args[0])
	if err != nil || d <= 0 {
		return c.Errf("%s: %q is not a positive duration such as 10s or 1m", opt, args[0])
	}
	if d < floor {
		return c.Errf("%s: %s is below the minimum of %s", opt, args[0], floor)
	}
	*dst = d
	return nil
}
