package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/rediserr"
	"github.com/pgcluster/pgcluster/lock"
)

// Defaults and bounds of status's flags.
const (
	defaultZone     = "pgcluster.lan."
	defaultInterval = 2 * time.Second
	minInterval     = 100 * time.Millisecond
	// secretEnv holds the fleet's redis_secret, when it has one: statuses
	// are then checked as the instances check them.
	secretEnv = "PGCLUSTER_REDIS_SECRET"
	// roundTimeout bounds one read of the registry and Redis.
	roundTimeout = 15 * time.Second
	// The fleet's check interval and timeout when its Corefile leaves
	// them out (the plugin's defaults): leases, memberships and how old
	// a status may be are measured by them.
	defaultCheckInterval = 2 * time.Second
	defaultCheckTimeout  = time.Second
)

// statusOptions are status's command line.
type statusOptions struct {
	postgres string
	redis    string
	prefix   string
	secret   []byte
	// checkInterval and checkTimeout are the fleet's interval and
	// timeout: what it reads from Redis is vetted by the bounds an
	// instance makes of them.
	checkInterval, checkTimeout time.Duration
	judge                       pgcluster.JudgeOptions
	watch                       bool
	interval                    time.Duration
	json                        bool
	registry                    string // the registry as shown: host:port/database
	redisShown                  string // the Redis URL as shown: scheme and hosts
}

func parseStatus(args []string, stderr io.Writer) (statusOptions, error) {
	o := statusOptions{judge: pgcluster.JudgeOptions{Zone: defaultZone}}
	fs := flag.NewFlagSet("pgclusterctl status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.postgres, "postgres", "", "the registry `DSN`, as the fleet's postgres option (required)")
	fs.StringVar(&o.redis, "redis", "", "the fleet's redis `URL`, as its redis option: adds each node's lease holder and check verdict (the fleet's redis_secret, if any, from $"+secretEnv+")")
	fs.StringVar(&o.prefix, "prefix", "", "the fleet's redis_prefix (default: pgcluster:<zone>:, as the fleet's default)")
	fs.DurationVar(&o.checkInterval, "check-interval", defaultCheckInterval, "the fleet's interval: with -redis, statuses, leases and members are vetted by the bounds it makes, as the instances vet them")
	fs.DurationVar(&o.checkTimeout, "check-timeout", defaultCheckTimeout, "the fleet's timeout, as -check-interval")
	fs.StringVar(&o.judge.Zone, "zone", defaultZone, "the first zone of the fleet's pgcluster block")
	fs.DurationVar(&o.judge.StaleAfter, "stale-after", 0, "the fleet's stale_after (default off)")
	fs.BoolVar(&o.judge.AllowLoopback, "allow-loopback", false, "the fleet has allow_loopback")
	maxLag := fs.String("max-lag", "", "the fleet's max_lag, in bytes or with kB, MB, GB, TB, or a duration (default off)")
	fs.BoolVar(&o.watch, "watch", false, "redraw every -interval until interrupted")
	fs.DurationVar(&o.interval, "interval", defaultInterval, fmt.Sprintf("with -watch, time between two reports (at least %s)", minInterval))
	fs.BoolVar(&o.json, "json", false, "print JSON (with -watch, one object per line)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: pgclusterctl status -postgres DSN [-redis URL] [flags]

Every node of the registry, judged as the fleet judges it, with the fleet's
checks and leases from Redis. Give the options the fleet's Corefile has
(allow_loopback, stale_after, max_lag, the zone or redis_prefix): the
verdicts depend on them. Exit status: 0 when every cluster has exactly one
serving primary, 1 when one has none or two, 2 on an error.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q: status takes flags only", fs.Arg(0))
	case o.postgres == "":
		return o, errors.New("-postgres DSN is required: the registry to read")
	case o.interval < minInterval:
		return o, fmt.Errorf("-interval %v is below %v", o.interval, minInterval)
	case o.judge.StaleAfter < 0:
		return o, fmt.Errorf("-stale-after %v is negative", o.judge.StaleAfter)
	case o.prefix != "" && o.redis == "":
		return o, errors.New("-prefix needs -redis: it names the fleet's keys in Redis")
	case o.checkInterval <= 0 || o.checkTimeout <= 0:
		return o, fmt.Errorf("-check-interval %v and -check-timeout %v must be positive: give the fleet's interval and timeout", o.checkInterval, o.checkTimeout)
	}
	if d, err := time.ParseDuration(*maxLag); *maxLag != "" && err == nil && d > 0 {
		o.judge.MaxLagTime = d
	} else if *maxLag != "" {
		n, err := pgcluster.ParseBytes(*maxLag)
		if err != nil {
			return o, fmt.Errorf("-max-lag: %v (or a duration, as 5s)", err)
		}
		o.judge.MaxLag = n
	}
	if o.redis != "" {
		// The check's type only names it in texts this command does not
		// print: the fleet's verdicts come as they are.
		o.judge.Check = "postgres"
		if o.prefix == "" {
			o.prefix = pgcluster.DefaultRedisPrefix(o.judge.Zone)
		}
		o.redisShown = showURL(o.redis)
		o.secret = []byte(os.Getenv(secretEnv))
	}
	o.registry = pgcluster.RegistryName(o.postgres)
	return o, nil
}

// lockConfig is the fleet's coordination as its instances configure it:
// what status reads from Redis is vetted as they vet it.
func (o statusOptions) lockConfig() lock.Config {
	return lock.Config{Prefix: o.prefix, Secret: o.secret, Interval: o.checkInterval, Timeout: o.checkTimeout}
}

// showURL is a Redis URL without its user, password or query: its scheme
// and hosts.
func showURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(the -redis URL)"
	}
	return u.Scheme + "://" + u.Host
}

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseStatus(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "pgclusterctl status:", err)
		return exitFailed
	}
	var rdb redis.UniversalClient
	var dials *rediserr.Dials // what a read that timed out met
	if o.redis != "" {
		if rdb, err = pgcluster.NewRedisClient(o.redis); err != nil {
			fmt.Fprintln(stderr, "pgclusterctl status: -redis:", err)
			return exitFailed
		}
		defer rdb.Close()
		dials = rediserr.Watch(rdb)
	}
	if !o.watch {
		r, err := gather(ctx, o, rdb, dials)
		if err != nil {
			fmt.Fprintln(stderr, "pgclusterctl status:", err)
			return exitFailed
		}
		if err := r.write(stdout, o.json, false, false); err != nil {
			fmt.Fprintln(stderr, "pgclusterctl status:", err)
			return exitFailed
		}
		return r.exitCode()
	}
	return watch(ctx, o, rdb, dials, stdout, stderr)
}

// watch reports every o.interval until ctx is done, and returns the exit
// status of the last report (exitFailed when the last round failed).
func watch(ctx context.Context, o statusOptions, rdb redis.UniversalClient, dials *rediserr.Dials, stdout, stderr io.Writer) int {
	code := exitFailed
	clearScreen := !o.json && isTerminal(stdout)
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for {
		r, err := gather(ctx, o, rdb, dials)
		switch {
		case ctx.Err() != nil:
			return code
		case err != nil:
			code = exitFailed
			fmt.Fprintf(stderr, "pgclusterctl status: %s: %v\n", time.Now().Format(time.TimeOnly), err)
		default:
			code = r.exitCode()
			if err := r.write(stdout, o.json, true, clearScreen); err != nil {
				fmt.Fprintln(stderr, "pgclusterctl status:", err)
				return exitFailed
			}
		}
		select {
		case <-ctx.Done():
			return code
		case <-t.C:
		}
	}
}

// isTerminal reports whether w is a terminal, which -watch redraws.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// gather reads the registry and, with rdb, the fleet, and judges every node.
func gather(ctx context.Context, o statusOptions, rdb redis.UniversalClient, dials *rediserr.Dials) (*report, error) {
	ctx, cancel := context.WithTimeout(ctx, roundTimeout)
	defer cancel()
	nodes, _, networks, err := pgcluster.ReadRegistry(ctx, o.postgres)
	if err != nil {
		return nil, fmt.Errorf("-postgres: %w", err)
	}
	r := &report{Time: time.Now().UTC(), Registry: o.registry, Zone: o.judge.Zone, Checks: rdb != nil}
	for _, n := range networks {
		r.Networks = append(r.Networks, networkReport{Network: n.Network.String(), Region: n.Region, Zone: n.Zone})
	}
	var fleet *lock.Fleet
	view := health.View{}
	if rdb != nil {
		keys := make([]string, 0, len(nodes))
		for _, n := range nodes {
			keys = append(keys, strings.ToLower(n.Cluster+"/"+n.Name))
		}
		fleet, err = lock.ReadFleet(ctx, rdb, o.lockConfig(), keys)
		if err != nil {
			return nil, fmt.Errorf("-redis %s: Redis does not answer (%v); the fleet is then in local mode, each instance checking every node itself", o.redisShown, dials.Explain(err))
		}
		r.Fleet = newFleetReport(fleet, o)
		for _, n := range nodes {
			key := strings.ToLower(n.Cluster + "/" + n.Name)
			if v, ok := verdict(fleet.Keys[key], n); ok {
				view[key] = v
			}
		}
	}
	clusters, err := pgcluster.Judge(nodes, view, o.judge)
	if err != nil {
		return nil, err
	}
	for _, c := range clusters {
		r.Clusters = append(r.Clusters, newClusterReport(c, fleet))
	}
	served := false
	r.OK = true
	for _, c := range r.Clusters {
		r.OK = r.OK && c.OK
		served = served || c.Served
	}
	r.OK = r.OK && served
	r.AllOut = allOutFor(r, o)
	return r, nil
}

// verdict is the check verdict the fleet answers n with: the stored
// status's, when it passed vetting, is of n's address, covers n (not
// stale) and is decided, as an instance applies it. A stale status is no
// verdict: every instance probes the node itself (see stale).
func verdict(k lock.KeyState, n pgcluster.Node) (health.Verdict, bool) {
	if k.Status == nil || k.Status.Addr != target(n) || k.Stale != "" {
		return health.Verdict{}, false
	}
	v := k.Status.Progress.Verdict
	return v, v.State != health.Unknown
}

// target is where the fleet checks n: its registry address and port.
func target(n pgcluster.Node) netip.AddrPort {
	if n.Port < 1 || n.Port > 65535 {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(n.Address.Unmap(), uint16(n.Port))
}
