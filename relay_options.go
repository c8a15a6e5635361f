package pgcluster

import "github.com/coredns/caddy"

// parseRelayOption parses "relay on|off".
func parseRelayOption(c *caddy.Controller, cfg *settings, args []string) error {
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
