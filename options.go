package pgcluster

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/miekg/dns"
)

// Checks of Corefile option values. Each returns why a value is refused, or
// "" when it is fine, so that the caller names the option and the line.

// badDomain says why z cannot be a zone: it must be a domain name, with no
// empty label.
func badDomain(z string) string {
	_, ok := dns.IsDomainName(z)
	if !ok || strings.Contains(z, "..") || z != "." && strings.HasPrefix(z, ".") {
		return "is not a domain name"
	}
	// Queries reach the plugin in presentation form (request.Name: "'" as
	// "\\'"): a name spelled otherwise would never match one (FuzzSetup,
	// seed c89e1dc02d98195f: zone "'." answered nothing, SERVFAIL).
	if dns.Name(z).String() != z {
		return "has characters a query spells escaped (write " + dns.Name(z).String() + ")"
	}
	return ""
}

// zonesOverlap refuses zones of which one is equal to or inside another: a
// name in both could be fed from two sources (a node of the outer zone's
// cluster and a cluster of the inner zone). zones are normalized.
func zonesOverlap(zones []string) error {
	for i, a := range zones {
		for _, b := range zones[i+1:] {
			switch {
			case a == b:
				return fmt.Errorf("zone %q is given twice", a)
			case dns.IsSubDomain(a, b), dns.IsSubDomain(b, a):
				outer, inner := a, b
				if dns.IsSubDomain(b, a) {
					outer, inner = b, a
				}
				return fmt.Errorf("zones %q and %q overlap: names in %q could come from both; serve %q from its own server block", outer, inner, inner, inner)
			}
		}
	}
	return nil
}

// badDSN parses dsn as the registry connection will, so that a DSN that can
// never connect stops start-up. The reason never contains the DSN, whose
// password pgconn's errors do not always hide.
func badDSN(dsn string) string {
	cfg, err := pgx.ParseConfig(dsn)
	if err == nil && unixOnly(cfg.Config) {
		// pgconn skips the TLS settings, sslmode included, for Unix
		// sockets; libpq checks them anyway. Parse again for a TCP host.
		_, err = pgx.ParseConfig(withTCPHost(dsn))
	}
	if err == nil {
		return ""
	}
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return "it is not a libpq URL or key=value string"
	}
	quiet := *pe
	quiet.ConnString = ""
	why := strings.TrimPrefix(quiet.Error(), "cannot parse ``: ")
	return strings.ReplaceAll(why, dsn, "(the DSN)")
}

// unixOnly reports whether every host of cfg is a Unix socket directory.
func unixOnly(cfg pgconn.Config) bool {
	if !strings.HasPrefix(cfg.Host, "/") {
		return false
	}
	for _, f := range cfg.Fallbacks {
		if !strings.HasPrefix(f.Host, "/") {
			return false
		}
	}
	return true
}

// withTCPHost returns dsn with its host replaced by localhost: in both forms
// the last host setting wins.
func withTCPHost(dsn string) string {
	switch {
	case !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://"):
		return dsn + " host=localhost"
	case strings.Contains(dsn, "?"):
		return dsn + "&host=localhost"
	default:
		return dsn + "?host=localhost"
	}
}

// badSelfNode says why node cannot name a node: it is "name" or
// "cluster/name", each a DNS label.
func badSelfNode(node string) string {
	parts := strings.Split(node, "/")
	if len(parts) > 2 {
		return "is not a node name or cluster/name"
	}
	for _, l := range parts {
		if !isLabel(l) {
			return fmt.Sprintf("is not a node name or cluster/name: %q is not a DNS label (letters, digits, inner hyphens)", l)
		}
	}
	return ""
}

// badSelfAddr says why a remote client could not use a, unmapped, as this
// host's address.
func badSelfAddr(a netip.Addr) string {
	switch {
	case a.Zone() != "":
		return "has a zone (%" + a.Zone() + "), which means nothing to another host"
	case a.IsLoopback():
		return "is a loopback address, which self exists to replace"
	}
	if why := unusableAddr(a); why != "" {
		return "is " + why
	}
	return ""
}
