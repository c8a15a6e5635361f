package pgcluster

import (
	"fmt"

	"github.com/coredns/caddy"
)

// Bounds of the Redis options.
const (
	// minRedisSecret: the secret is the HMAC key of every status.
	minRedisSecret = 16
	maxRedisPrefix = 200
)

// parseRedisOption parses redis, redis_prefix and redis_secret.
func parseRedisOption(c *caddy.Controller, cfg *settings, opt string, args []string) error {
	if len(args) != 1 {
		return c.ArgErr()
	}
	v := args[0]
	switch opt {
	case "redis":
		if _, err := parseRedisURL(v); err != nil {
			return c.Errf("redis: the URL cannot be used: %v", err)
		}
		cfg.redisURL = v
	case "redis_prefix":
		if why := badRedisPrefix(v); why != "" {
			return c.Errf("redis_prefix: %q %s", v, why)
		}
		cfg.redisPrefix = v
	case "redis_secret":
		if len(v) < minRedisSecret {
			return c.Errf("redis_secret: %d bytes is too short: it is the HMAC key that signs every status and the registry copy, and whoever can forge one steers traffic; give at least %d bytes (openssl rand -base64 32)", len(v), minRedisSecret)
		}
		cfg.redisSecret = []byte(v)
	}
	return nil
}

// redisOptionsAgree refuses Redis options that cannot work together, naming
// the line of the option at fault (lines: each option's line), and sets the
// default redis_prefix.
func redisOptionsAgree(c *caddy.Controller, cfg *settings, lines map[string]int) error {
	at := func(opt, format string, args ...any) error {
		return fmt.Errorf("%s:%d - Error during parsing: %s", c.File(), lines[opt], fmt.Sprintf(format, args...))
	}
	if cfg.redisURL == "" {
		for _, opt := range []string{"redis_prefix", "redis_secret", "relay", "relay_grace"} {
			if lines[opt] > 0 {
				return at(opt, "%s needs redis URL: without Redis there is nothing to prefix, sign or relay", opt)
			}
		}
		return nil
	}
	if !cfg.checksOn() && cfg.relayOff {
		return at("relay", "relay off leaves redis nothing to do without check tcp or check postgres: the fleet shares its health checks and its registry through Redis; remove redis, or turn the relay or the checks on")
	}
	if cfg.relayOff && lines["relay_grace"] > 0 {
		return at("relay_grace", "relay_grace needs the relay: with relay off every instance follows PostgreSQL itself and has no copy to serve")
	}
	if cfg.redisPrefix == "" {
		p := "pgcluster:" + cfg.zones[0] + ":"
		if why := badRedisPrefix(p); why != "" {
			return at("redis", "redis: the default redis_prefix %q, made from the zone, %s; give redis_prefix", p, why)
		}
		cfg.redisPrefix = p
	}
	return nil
}

// badRedisPrefix says why p cannot prefix the key names: 1 to 200 bytes of
// printable ASCII without spaces or braces.
func badRedisPrefix(p string) string {
	if len(p) == 0 || len(p) > maxRedisPrefix {
		return fmt.Sprintf("is %d bytes; give 1 to %d", len(p), maxRedisPrefix)
	}
	for i := 0; i < len(p); i++ {
		switch b := p[i]; {
		case b == '{' || b == '}':
			return "contains a brace: key names put the backend in a {...} hash tag so that its lease and status share a Redis Cluster slot, and a brace in the prefix would move the tag"
		case b <= ' ' || b > '~':
			return fmt.Sprintf("contains %q: give printable ASCII without spaces", b)
		}
	}
	return ""
}
