package pgcluster

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/coredns/caddy"
)

// Scopes of the health checks (check_scope): the whole fleet shares one
// verdict per node, or each zone (region) has its own, probed from there.
const (
	scopeFleet  = "fleet"
	scopeZone   = "zone"
	scopeRegion = "region"
)

// parseSegmentOption parses "location REGION [ZONE]", "check_scope
// fleet|zone|region" and "probe_source ADDRESS".
func parseSegmentOption(c *caddy.Controller, cfg *settings, opt string, args []string) error {
	switch opt {
	case "location":
		if len(args) < 1 || len(args) > 2 {
			return c.ArgErr()
		}
		zone := ""
		if len(args) == 2 {
			zone = args[1]
		}
		region, zone, bad := checkPlace(args[0], zone)
		if bad != "" {
			return c.Errf("location: %s: give the region and zone this instance runs in, as the registry's rows name them", bad)
		}
		cfg.location = place{region, zone}
	case "check_scope":
		if len(args) != 1 {
			return c.ArgErr()
		}
		switch args[0] {
		case scopeFleet, scopeZone, scopeRegion:
			cfg.checkScope = args[0]
		default:
			return c.Errf("check_scope: %q is not fleet, zone or region", args[0])
		}
	case "probe_source":
		if len(args) != 1 {
			return c.ArgErr()
		}
		a, err := netip.ParseAddr(args[0])
		if err != nil || a.Zone() != "" {
			return c.Errf("probe_source: %q is not an IP address", args[0])
		}
		a = a.Unmap()
		if a.IsUnspecified() || a.IsMulticast() {
			return c.Errf("probe_source: %s is not an address of this host to probe from", a)
		}
		cfg.probeSource = a
	}
	return nil
}

// segmentOptionsAgree refuses segment options that cannot work together;
// it runs after the redis options are checked.
func segmentOptionsAgree(cfg *settings) error {
	if cfg.passive && cfg.redisURL == "" {
		return errors.New("check passive needs redis: a passive instance answers from the statuses the probing instances write there")
	}
	if cfg.passive && cfg.relayOff {
		return errors.New("check passive needs the relay (relay on): a passive instance reaches no database, the registry's either, and reads the registry from Redis")
	}
	if cfg.probeSource.IsValid() && (!cfg.checksOn() || cfg.passive) {
		return errors.New("probe_source needs check tcp or check postgres: a passive instance, or one without checks, sends no probe")
	}
	if cfg.checkScope == scopeFleet {
		return nil
	}
	switch {
	case !cfg.checksOn():
		return fmt.Errorf("check_scope %s needs a check: without checks there are no verdicts to keep per %s", cfg.checkScope, cfg.checkScope)
	case cfg.redisURL == "":
		return fmt.Errorf("check_scope %s needs redis: the verdicts of each %s are shared through Redis", cfg.checkScope, cfg.checkScope)
	case cfg.location.region == "":
		return fmt.Errorf("check_scope %s needs location REGION ZONE: the %s this instance probes for", cfg.checkScope, cfg.checkScope)
	case cfg.checkScope == scopeZone && cfg.location.zone == "":
		return errors.New("check_scope zone needs location REGION ZONE with a zone: the zone this instance probes for")
	}
	return nil
}

// segmented reports whether each segment of the network has its own
// verdicts (check_scope zone or region).
func (s *settings) segmented() bool { return s.checkScope == scopeZone || s.checkScope == scopeRegion }

// segmentOf is the segment of the network a place is in, by check_scope:
// "zone REGION/ZONE" or "region REGION"; "" when the place names none at
// that scope (its clients are answered with this instance's segment's
// verdicts).
func (s *settings) segmentOf(pl place) string {
	key, ok := s.segmentKey(pl)
	if !ok {
		return ""
	}
	return segmentName(key)
}

// segmentKey is the place key of pl's segment: the region and zone with
// check_scope zone, the region alone with region; ok false when pl names
// no segment at that scope.
func (s *settings) segmentKey(pl place) (place, bool) {
	switch {
	case s.checkScope == scopeZone && pl.region != "" && pl.zone != "":
		return pl, true
	case s.checkScope == scopeRegion && pl.region != "":
		return place{region: pl.region}, true
	}
	return place{}, false
}

// segmentName names the segment of a place key (see segmentKey): "zone
// REGION/ZONE" when it has a zone, else "region REGION".
func segmentName(key place) string {
	if key.zone != "" {
		return "zone " + key.region + "/" + key.zone
	}
	return "region " + key.region
}

// home is the segment this instance runs in: "" with check_scope fleet.
func (s *settings) home() string { return s.segmentOf(s.location) }

// segmentPrefix is the Redis prefix of a segment's members, leases and
// statuses: the fleet's, then the segment ("zone/REGION/ZONE:",
// "region/REGION:"), so that each segment elects its own probers.
func (s *settings) segmentPrefix(seg string) string { return SegmentPrefix(s.redisPrefix, seg) }

// SegmentPrefix is the Redis prefix of segment seg ("zone REGION/ZONE",
// "region REGION"; "": the fleet's) of a fleet under prefix.
func SegmentPrefix(prefix, seg string) string {
	if seg == "" {
		return prefix
	}
	return prefix + strings.ReplaceAll(seg, " ", "/") + ":"
}

// ParseSegment reads a segment as _client's TXT shows it ("zone:REGION/ZONE",
// "region:REGION") into its name ("zone REGION/ZONE").
func ParseSegment(s string) (string, error) {
	kind, rest, _ := strings.Cut(s, ":")
	region, zone, hasZone := strings.Cut(rest, "/")
	r, z, bad := checkPlace(region, zone)
	switch {
	case bad != "":
		return "", errors.New(bad)
	case kind == scopeZone && hasZone && r != "" && z != "":
		return segmentName(place{r, z}), nil
	case kind == scopeRegion && !hasZone && r != "":
		return segmentName(place{region: r}), nil
	}
	return "", fmt.Errorf("%q is not zone:REGION/ZONE or region:REGION", s)
}
