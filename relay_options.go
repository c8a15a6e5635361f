package pgcluster

import (
	"time"

	"github.com/coredns/caddy"
)

// defaultRelayGrace is how long a reader keeps serving its last registry
// copy while Redis does not answer before it follows PostgreSQL itself
// (see relay_grace): a Redis outage of a few seconds opens no registry
// session, and a longer one opens them spread over a second grace.
const defaultRelayGrace = 10 * time.Second

// parseRelayOption parses "relay on|off" and "relay_grace DURATION|0".
func parseRelayOption(c *caddy.Controller, cfg *settings, opt string, args []string) error {
	if opt == "relay_grace" {
		return setDuration(&cfg.relayGrace, c, opt, args, 0, true)
	}
	if len(args) != 1 {
		return c.ArgErr()
	}
	switch args[0] {
	case "on":
		cfg.relayOff = false
	case "off":
		cfg.relayOff = true
	default:
		return c.Errf("relay: %q is neither on nor off", args[0])
	}
	return nil
}

// relayOn reports whether the registry is relayed through Redis: one
// follower of PostgreSQL per fleet.
func (s *settings) relayOn() bool { return s.redisURL != "" && !s.relayOff }
