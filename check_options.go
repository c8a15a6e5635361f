package pgcluster

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/coredns/caddy"

	"github.com/pgcluster/pgcluster/health"
)

// parseCheckOption parses the options of the active health checks: check,
// interval, timeout, rise, fall, max_lag, all_down, role_interval,
// split_brain, primary_hold and probe_budget.
func parseCheckOption(c *caddy.Controller, cfg *settings, opt string, args []string) error {
	switch opt {
	case "check":
		if len(args) < 1 {
			return c.ArgErr()
		}
		switch args[0] {
		case "off":
			if len(args) != 1 {
				return c.ArgErr()
			}
			cfg.check = ""
		case "passive":
			if len(args) != 1 {
				return c.Errf("check passive: takes no options: this instance probes nothing and follows the verdicts the fleet's probing instances share through Redis")
			}
			// Judged as check postgres judges: the statuses it follows
			// carry the roles when the fleet probes with check postgres.
			cfg.check, cfg.passive = checkPostgres, true
		case checkTCP:
			if len(args) != 1 {
				return c.Errf("check tcp: takes no options (%q)", strings.Join(args[1:], " "))
			}
			cfg.check = checkTCP
		case checkPostgres:
			if len(args) > 2 {
				return c.Errf("check postgres: give the options as one quoted string: check postgres \"user=monitor dbname=postgres\"")
			}
			cfg.check = checkPostgres
			if len(args) == 2 {
				if why := badCheckOptions(args[1]); why != "" {
					return c.Errf("check postgres: %s", why)
				}
				cfg.checkOptions = args[1]
			}
		default:
			return c.Errf("check: %q is not tcp, postgres, passive or off", args[0])
		}
	case "interval":
		if err := setDuration(&cfg.interval, c, opt, args, minInterval, false); err != nil {
			return err
		}
	case "timeout":
		if err := setDuration(&cfg.timeout, c, opt, args, minTimeout, false); err != nil {
			return err
		}
	case "rise", "fall":
		if len(args) != 1 {
			return c.ArgErr()
		}
		n, err := strconv.Atoi(args[0])
		if err != nil || n < 1 || n > maxCount {
			return c.Errf("%s: %q is not a count from 1 to %d", opt, args[0], maxCount)
		}
		if opt == "rise" {
			cfg.rise = n
		} else {
			cfg.fall = n
		}
	case "max_lag":
		if len(args) != 1 {
			return c.ArgErr()
		}
		if d, err := time.ParseDuration(args[0]); err == nil {
			if d <= 0 {
				return c.Errf("max_lag: %s is not a positive duration", args[0])
			}
			cfg.maxLag, cfg.maxLagTime = 0, d
			return nil
		}
		n, err := parseBytes(args[0])
		if err != nil {
			return c.Errf("max_lag: %v (or a duration, as 5s)", err)
		}
		cfg.maxLag, cfg.maxLagTime = n, 0
	case "all_down":
		if len(args) != 1 || args[0] != allDownOpen && args[0] != allDownClosed {
			return c.Errf("all_down: want open or closed")
		}
		cfg.allDown = args[0]
	case "role_interval":
		if len(args) == 1 && args[0] == "off" {
			cfg.roleInterval = health.NoSessions
			return nil
		}
		if err := setDuration(&cfg.roleInterval, c, opt, args, minRoleInterval, false); err != nil {
			return err
		}
	case "split_brain":
		if len(args) != 1 || args[0] != splitBrainClosed && args[0] != splitBrainNewestTimeline {
			return c.Errf("split_brain: want %s or %s", splitBrainClosed, splitBrainNewestTimeline)
		}
		cfg.splitBrain = args[0]
	case "primary_hold":
		if err := setDuration(&cfg.primaryHold, c, opt, args, minTimeout, true); err != nil {
			return err
		}
	case "probe_budget":
		if len(args) != 1 {
			return c.ArgErr()
		}
		if args[0] == "off" || args[0] == "0" {
			cfg.probeBudget = 0
			return nil
		}
		n, err := strconv.Atoi(args[0])
		if err != nil || n < 1 || n > maxProbeBudget {
			return c.Errf("probe_budget: %q is not a number of probes a second from 1 to %d, or off", args[0], maxProbeBudget)
		}
		cfg.probeBudget = n
	}
	return nil
}

// probeBudgetFor is the probe budget, in probes a second, while nodes are
// checked: probe_budget, or by default, with redis, the larger of
// probeBudgetFloor and half the nodes' probes a second (nodes / 2
// intervals), and none without redis. A fleet's instances share the probes
// (about nodes / instances each an interval), so the default never holds
// them back while two or more share them, and an instance that loses Redis
// and probes every node itself does so at most at half the rate, each node
// at least every two intervals: a fleet that loses Redis raises its probes
// by the budget, not by the nodes. An instance alone probes every node
// anyway; nothing multiplies its probes.
func (s *settings) probeBudgetFor(nodes int) float64 {
	switch {
	case s.probeBudget >= 0:
		return float64(s.probeBudget)
	case s.redisURL == "":
		return 0
	}
	return max(probeBudgetFloor, float64(nodes)/(2*s.interval.Seconds()))
}

// checkOptionsAgree refuses check options that cannot work together.
func checkOptionsAgree(cfg *settings) error {
	// Without any check too: max_lag alone would be silently ignored.
	if (cfg.maxLag > 0 || cfg.maxLagTime > 0) && cfg.check != checkPostgres {
		return errors.New("max_lag needs check postgres: only it reads the WAL positions")
	}
	if cfg.roleInterval != 0 && cfg.check != checkPostgres {
		return errors.New("role_interval needs check postgres: only it keeps a session to read the role on")
	}
	if cfg.primaryHold >= 0 && !cfg.checksOn() {
		return errors.New("primary_hold needs a check: only a check takes a primary out")
	}
	if cfg.probeBudget != probeBudgetDefault && !cfg.checksOn() {
		return errors.New("probe_budget needs a check: only the checks probe")
	}
	if cfg.splitBrain == splitBrainNewestTimeline && cfg.check != checkPostgres {
		return errors.New("split_brain newest_timeline needs check postgres: only it reads the timelines")
	}
	if !cfg.checksOn() {
		return nil
	}
	if cfg.timeout >= cfg.interval {
		return fmt.Errorf("timeout %s must be shorter than interval %s: one probe in flight per node", cfg.timeout, cfg.interval)
	}
	if _, err := health.New(cfg.healthConfig(nil)); err != nil {
		return fmt.Errorf("check: %v", err)
	}
	return nil
}

// badCheckOptions says why opts cannot be the options of check postgres:
// libpq key=value pairs, without the host and port that come from the
// registry.
func badCheckOptions(opts string) string {
	if strings.Contains(opts, "://") {
		return "give key=value options (user=monitor dbname=postgres), not a URL: host and port come from the registry"
	}
	for _, kv := range strings.Fields(opts) {
		k, _, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Sprintf("%q is not key=value", kv)
		}
		switch k {
		case "host", "hostaddr", "port":
			return fmt.Sprintf("%s: host and port come from the registry's rows; leave it out", k)
		}
	}
	if why := badDSN(opts + " host=localhost"); why != "" {
		return why
	}
	return ""
}

// parseBytes reads a byte count: a whole number with an optional unit kB,
// MB, GB (powers of 1024, as PostgreSQL's own settings).
func parseBytes(s string) (int64, error) {
	mult := int64(1)
	num := s
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"kB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30}, {"TB", 1 << 40}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			num, mult = strings.TrimSuffix(s, u.suffix), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 1 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a positive number of bytes such as 16MB, 1GB or 1048576", s)
	}
	return n * mult, nil
}
