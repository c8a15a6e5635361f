package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/rediserr"
	"github.com/pgcluster/pgcluster/lock"
)

// fleetOptions say how the fleet judges its nodes: the registry, its Redis
// and the options of its Corefile that decide in or out. status judges
// every node with them, drain the nodes its guards count.
type fleetOptions struct {
	postgres string
	redis    string
	prefix   string
	segment  string // -segment as parsed: "zone REGION/ZONE", "region REGION" or ""
	secret   []byte
	// checkInterval and checkTimeout are the fleet's interval and
	// timeout: what it reads from Redis is vetted by the bounds an
	// instance makes of them.
	checkInterval, checkTimeout time.Duration
	judge                       pgcluster.JudgeOptions
	maxLag                      string // -max-lag as given
	registry                    string // the registry as shown: host:port/database
	redisShown                  string // the Redis URL as shown: scheme and hosts
}

// flags defines the fleet's flags on fs; redisUsage says what -redis adds.
func (o *fleetOptions) flags(fs *flag.FlagSet, redisUsage string) {
	o.judge.Zone = defaultZone
	fs.StringVar(&o.postgres, "postgres", "", "the registry `DSN`, as the fleet's postgres option (required)")
	fs.StringVar(&o.redis, "redis", "", "the fleet's redis `URL`, as its redis option: "+redisUsage+" (the fleet's redis_secret, if any, from $"+secretEnv+")")
	fs.StringVar(&o.prefix, "prefix", "", "the fleet's redis_prefix (default: pgcluster:<zone>:, as the fleet's default)")
	fs.Func("segment", "with check_scope zone or region: the `segment` whose probers' verdicts to read, as _client's TXT names it (zone:REGION/ZONE, region:REGION)", func(s string) error {
		seg, err := pgcluster.ParseSegment(s)
		o.segment = seg
		return err
	})
	fs.DurationVar(&o.checkInterval, "check-interval", defaultCheckInterval, "the fleet's interval: with -redis, statuses, leases and members are vetted by the bounds it makes, as the instances vet them")
	fs.DurationVar(&o.checkTimeout, "check-timeout", defaultCheckTimeout, "the fleet's timeout, as -check-interval")
	fs.StringVar(&o.judge.Zone, "zone", defaultZone, "the first zone of the fleet's pgcluster block")
	fs.DurationVar(&o.judge.StaleAfter, "stale-after", 0, "the fleet's stale_after (default off)")
	fs.BoolVar(&o.judge.AllowLoopback, "allow-loopback", false, "the fleet has allow_loopback")
	fs.StringVar(&o.maxLag, "max-lag", "", "the fleet's max_lag, in bytes or with kB, MB, GB, TB, or a duration (default off)")
}

// finish checks the fleet's flags once parsed, and completes them.
func (o *fleetOptions) finish() error {
	switch {
	case o.postgres == "":
		return errors.New("-postgres DSN is required: the registry to read")
	case o.judge.StaleAfter < 0:
		return fmt.Errorf("-stale-after %v is negative", o.judge.StaleAfter)
	case o.prefix != "" && o.redis == "":
		return errors.New("-prefix needs -redis: it names the fleet's keys in Redis")
	case o.segment != "" && o.redis == "":
		return errors.New("-segment needs -redis: a segment's verdicts are in Redis")
	case o.checkInterval <= 0 || o.checkTimeout <= 0:
		return fmt.Errorf("-check-interval %v and -check-timeout %v must be positive: give the fleet's interval and timeout", o.checkInterval, o.checkTimeout)
	}
	if d, err := time.ParseDuration(o.maxLag); o.maxLag != "" && err == nil && d > 0 {
		o.judge.MaxLagTime = d
	} else if o.maxLag != "" {
		n, err := pgcluster.ParseBytes(o.maxLag)
		if err != nil {
			return fmt.Errorf("-max-lag: %v (or a duration, as 5s)", err)
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
	return nil
}

// lockConfig is the fleet's coordination as its instances configure it:
// what is read from Redis is vetted as they vet it.
func (o fleetOptions) lockConfig() lock.Config {
	return lock.Config{Prefix: pgcluster.SegmentPrefix(o.prefix, o.segment), Segment: o.segment, Secret: o.secret, Interval: o.checkInterval, Timeout: o.checkTimeout}
}

// redisClient is a client of the fleet's Redis, and what its dials meet
// (for a read that timed out); nil without -redis. Close it.
func (o fleetOptions) redisClient() (redis.UniversalClient, *rediserr.Dials, error) {
	if o.redis == "" {
		return nil, nil, nil
	}
	rdb, err := pgcluster.NewRedisClient(o.redis)
	if err != nil {
		return nil, nil, fmt.Errorf("-redis: %w", err)
	}
	return rdb, rediserr.Watch(rdb), nil
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
