package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/rediserr"
	"github.com/pgcluster/pgcluster/lock"
)

// Defaults and bounds of the flags.
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
	fleetOptions
	watch    bool
	interval time.Duration
	json     bool
}

func parseStatus(args []string, stderr io.Writer) (statusOptions, error) {
	var o statusOptions
	fs := flag.NewFlagSet("pgclusterctl status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.flags(fs, "adds each node's lease holder and check verdict")
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
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q: status takes flags only", fs.Arg(0))
	}
	if err := o.finish(); err != nil {
		return o, err
	}
	if o.interval < minInterval {
		return o, fmt.Errorf("-interval %v is below %v", o.interval, minInterval)
	}
	return o, nil
}

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseStatus(args, stderr)
	if code, done := parsed("status", err, stderr); done {
		return code
	}
	rdb, dials, err := o.redisClient() // dials: what a read that timed out met
	if err != nil {
		fmt.Fprintln(stderr, "pgclusterctl status:", err)
		return exitFailed
	}
	if rdb != nil {
		defer rdb.Close()
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
	r, err := assess(ctx, o.fleetOptions, nodes, rdb, dials)
	if err != nil {
		return nil, err
	}
	for _, n := range networks {
		r.Networks = append(r.Networks, networkReport{Network: n.Network.String(), Region: n.Region, Zone: n.Zone})
	}
	return r, nil
}

// assess judges every node of nodes as the fleet does: by the registry
// and, with rdb, by the fleet's check verdicts read from Redis.
func assess(ctx context.Context, o fleetOptions, nodes []pgcluster.Node, rdb redis.UniversalClient, dials *rediserr.Dials) (*report, error) {
	r := &report{Time: time.Now().UTC(), Registry: o.registry, Zone: o.judge.Zone, Checks: rdb != nil}
	var fleet *lock.Fleet
	verdicts := map[string]health.Verdict{}
	if rdb != nil {
		keys := make([]string, 0, len(nodes))
		for _, n := range nodes {
			keys = append(keys, strings.ToLower(n.Cluster+"/"+n.Name))
		}
		var err error
		fleet, err = lock.ReadFleet(ctx, rdb, o.lockConfig(), keys)
		if err != nil {
			return nil, fmt.Errorf("-redis %s: Redis does not answer (%v); the fleet is then in local mode, each instance checking every node itself", o.redisShown, dials.Explain(err))
		}
		r.Fleet = newFleetReport(fleet, o)
		for _, n := range nodes {
			key := strings.ToLower(n.Cluster + "/" + n.Name)
			if v, ok := verdict(fleet.Keys[key], n); ok {
				verdicts[key] = v
			}
		}
	}
	clusters, err := pgcluster.Judge(nodes, health.ViewOf(verdicts), o.judge)
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
