package pgcluster

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
)

// dsn is a valid DSN for the parser tests: nothing connects to it.
const dsn = "postgres://dns@db.example:5432/registry"

func TestSetupParse(t *testing.T) {
	tests := []struct {
		input   string
		errPart string // "" means no error
		check   func(t *testing.T, p *PgCluster, cfg *settings)
	}{
		{"pgcluster {\n postgres postgres://x@h/db\n}", "", func(t *testing.T, p *PgCluster, cfg *settings) {
			if cfg.dsn != "postgres://x@h/db" || cfg.ttl != defaultTTL || cfg.refresh != defaultRefresh || cfg.staleAfter != 0 || cfg.allowLoopback {
				t.Errorf("defaults: %+v", cfg)
			}
			if len(p.Zones) != 1 || p.Zones[0] != "pgcluster.lan." {
				t.Errorf("zones from the server block: %v", p.Zones)
			}
		}},
		{"pgcluster a.lan b.lan {\n postgres " + dsn + "\n ttl 30\n refresh 2s\n stale_after 3s\n allow_loopback\n self pg1\n self local/pg2 192.0.2.7\n fallthrough\n}", "", func(t *testing.T, p *PgCluster, cfg *settings) {
			if cfg.ttl != 30 || cfg.refresh != 2*time.Second || cfg.staleAfter != 3*time.Second || !cfg.allowLoopback {
				t.Errorf("options: %+v", cfg)
			}
			if strings.Join(p.Zones, ",") != "a.lan.,b.lan." {
				t.Errorf("zones: %v", p.Zones)
			}
			if a, ok := cfg.self["pg1"]; !ok || a.IsValid() {
				t.Errorf("self pg1: %v %v", a, ok)
			}
			if cfg.self["local/pg2"] != netip.MustParseAddr("192.0.2.7") {
				t.Errorf("self local/pg2: %v", cfg.self["local/pg2"])
			}
			if !p.Fall.Through("x.a.lan.") {
				t.Error("fallthrough not set")
			}
		}},
		{"pgcluster {\n postgres " + dsn + "\n stale_after off\n}", "", nil},
		{"pgcluster {\n postgres " + dsn + "\n}", "", func(t *testing.T, p *PgCluster, cfg *settings) {
			if cfg.topology != topologyOff || cfg.minLocal != 1 || p.topologyOn() {
				t.Errorf("topology defaults: %q %d", cfg.topology, cfg.minLocal)
			}
		}},
		{"pgcluster {\n postgres " + dsn + "\n topology local\n min_local 2\n}", "", func(t *testing.T, p *PgCluster, cfg *settings) {
			if cfg.topology != topologyLocal || cfg.minLocal != 2 || p.topology != topologyLocal || p.minLocal != 2 {
				t.Errorf("topology: %q %d", cfg.topology, cfg.minLocal)
			}
		}},
		{"pgcluster {\n postgres " + dsn + "\n topology nearest\n}", `topology: "nearest" is not off, prefer or local`, nil},
		{"pgcluster {\n postgres " + dsn + "\n min_local 0\n}", `min_local: "0" is not a count of nodes from 1 to 1000`, nil},
		{"pgcluster {\n postgres " + dsn + "\n topology\n}", "Wrong argument count", nil},
		{"pgcluster {\n postgres \"host=db.example dbname=registry sslmode=verify-full\"\n}", "", nil},
		{"pgcluster {\n postgres postgres:///registry?host=/var/run/postgresql\n}", "", nil},
		// The floors themselves are allowed.
		{"pgcluster {\n postgres " + dsn + "\n refresh 1s\n stale_after 1s\n}", "", func(t *testing.T, p *PgCluster, cfg *settings) {
			if cfg.refresh != minRefresh || cfg.staleAfter != minStaleAfter {
				t.Errorf("floors: %+v", cfg)
			}
		}},
		// self is per node: several nodes, and one node both bare and with
		// its cluster; node names are matched in lower case.
		{"pgcluster {\n postgres " + dsn + "\n self pg1\n self local/pg1 192.0.2.8\n self PG2 2001:db8::2\n self ::ffff:192.0.2.9\n}", `node "::ffff:192.0.2.9"`, nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1\n self local/pg1 192.0.2.8\n self PG2 2001:db8::2\n self pg3 ::ffff:192.0.2.9\n}", "", func(t *testing.T, p *PgCluster, cfg *settings) {
			if len(cfg.self) != 4 || cfg.self["local/pg1"] != netip.MustParseAddr("192.0.2.8") || cfg.self["pg2"] != netip.MustParseAddr("2001:db8::2") {
				t.Errorf("self: %v", cfg.self)
			}
			if cfg.self["pg3"] != netip.MustParseAddr("192.0.2.9") {
				t.Errorf("self pg3: an IPv4-mapped address is advertised as IPv4: %v", cfg.self["pg3"])
			}
		}},
		{"pgcluster {\n ttl 5\n}", "missing required option 'postgres DSN'", nil},
		{"pgcluster {\n postgres\n}", "Wrong argument count", nil},
		{"pgcluster {\n postgres " + dsn + "\n ttl -1\n}", "ttl", nil},
		{"pgcluster {\n postgres " + dsn + "\n ttl 100000\n}", "ttl", nil},
		{"pgcluster {\n postgres " + dsn + "\n refresh 0\n}", "refresh", nil},
		{"pgcluster {\n postgres " + dsn + "\n refresh soon\n}", "refresh", nil},
		{"pgcluster {\n postgres " + dsn + "\n stale_after -1s\n}", "stale_after", nil},
		{"pgcluster {\n postgres " + dsn + "\n allow_loopback yes\n}", "Wrong argument count", nil},
		{"pgcluster {\n postgres " + dsn + "\n self\n}", "Wrong argument count", nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1 nope\n}", "self", nil},
		{"pgcluster {\n postgres " + dsn + "\n colour blue\n}", `unknown property "colour"`, nil},
		{"pgcluster {\n postgres " + dsn + "\n}\npgcluster {\n postgres " + dsn + "\n}", "only be used once", nil},

		// A DSN that cannot be parsed.
		{"pgcluster {\n postgres not-a-dsn\n}", "postgres: the DSN cannot be used: failed to parse as keyword/value", nil},
		{"pgcluster {\n postgres :notaport\n}", "postgres: the DSN cannot be used", nil},
		{"pgcluster {\n postgres sslmode=bogus\n}", "postgres: the DSN cannot be used: failed to configure TLS (sslmode is invalid)", nil},
		{"pgcluster {\n postgres postgres:///registry?host=/tmp&sslmode=bogus\n}", "sslmode is invalid", nil},
		{"pgcluster {\n postgres postgres://dns@db:notaport/registry\n}", "postgres: the DSN cannot be used: invalid port", nil},
		{"pgcluster {\n postgres \"host=db connect_timeout=soon\"\n}", "postgres: the DSN cannot be used: invalid connect_timeout", nil},
		// Durations below their floor.
		{"pgcluster {\n postgres " + dsn + "\n refresh 1ns\n}", "refresh: 1ns is below the minimum of 1s", nil},
		{"pgcluster {\n postgres " + dsn + "\n refresh 999ms\n}", "refresh: 999ms is below the minimum of 1s", nil},
		{"pgcluster {\n postgres " + dsn + "\n stale_after 1ns\n}", "stale_after: 1ns is below the minimum of 1s", nil},
		{"pgcluster {\n postgres " + dsn + "\n stale_after 500ms\n}", "stale_after: 500ms is below the minimum of 1s", nil},
		// Self addresses no client could use.
		{"pgcluster {\n postgres " + dsn + "\n self pg1 0.0.0.0\n}", "self pg1: 0.0.0.0 is the unspecified address", nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1 ::\n}", "self pg1: :: is the unspecified address", nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1 fe80::1%eth0\n}", "self pg1: fe80::1%eth0 has a zone (%eth0)", nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1 fe80::1\n}", "self pg1: fe80::1 is a link-local address", nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1 169.254.1.1\n}", "self pg1: 169.254.1.1 is a link-local address", nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1 224.0.0.1\n}", "self pg1: 224.0.0.1 is a multicast address", nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1 ff02::1\n}", "self pg1: ff02::1 is a multicast address", nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1 255.255.255.255\n}", "self pg1: 255.255.255.255 is the broadcast address", nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1 127.0.0.1\n}", "self pg1: 127.0.0.1 is a loopback address", nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1 ::1\n}", "self pg1: ::1 is a loopback address", nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1 ::ffff:127.0.0.1\n}", "self pg1: ::ffff:127.0.0.1 is a loopback address", nil},
		{"pgcluster {\n postgres " + dsn + "\n self a/b/c\n}", `self: node "a/b/c" is not a node name or cluster/name`, nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg_1\n}", `self: node "pg_1" is not a node name or cluster/name`, nil},
		// Fallthrough zones must be domain names.
		{"pgcluster {\n postgres " + dsn + "\n fallthrough not..a..zone\n}", `fallthrough: zone "not..a..zone" is not a domain name`, nil},
		{"pgcluster {\n postgres " + dsn + "\n fallthrough a.lan .b.lan\n}", `fallthrough: zone ".b.lan" is not a domain name`, nil},
		// Every option at most once; self at most once per node.
		{"pgcluster {\n postgres " + dsn + "\n ttl 5\n ttl 30\n}", "ttl: given twice", nil},
		{"pgcluster {\n postgres " + dsn + "\n postgres postgres://other@h/db\n}", "postgres: given twice", nil},
		{"pgcluster {\n postgres " + dsn + "\n refresh 5s\n refresh 10s\n}", "refresh: given twice", nil},
		{"pgcluster {\n postgres " + dsn + "\n stale_after 5s\n stale_after off\n}", "stale_after: given twice", nil},
		{"pgcluster {\n postgres " + dsn + "\n allow_loopback\n allow_loopback\n}", "allow_loopback: given twice", nil},
		{"pgcluster {\n postgres " + dsn + "\n fallthrough\n fallthrough a.lan\n}", "fallthrough: given twice", nil},
		{"pgcluster {\n postgres " + dsn + "\n self pg1\n self pg1 192.0.2.1\n}", "self pg1: given twice", nil},
		{"pgcluster {\n postgres " + dsn + "\n self local/pg1\n self LOCAL/PG1\n}", "self local/pg1: given twice", nil},
		// Zones of one block may not overlap and must be domain names.
		{"pgcluster pgcluster.lan sub.pgcluster.lan {\n postgres " + dsn + "\n}", `zones "pgcluster.lan." and "sub.pgcluster.lan." overlap`, nil},
		{"pgcluster sub.pgcluster.lan pgcluster.lan {\n postgres " + dsn + "\n}", `zones "pgcluster.lan." and "sub.pgcluster.lan." overlap`, nil},
		{"pgcluster a.lan b.lan A.LAN. {\n postgres " + dsn + "\n}", `zone "a.lan." is given twice`, nil},
		{"pgcluster pgcluster.lan not..a..zone {\n postgres " + dsn + "\n}", `zone "not..a..zone" is not a domain name`, nil},
	}
	for i, tc := range tests {
		c := caddy.NewTestController("dns", tc.input)
		c.ServerBlockKeys = []string{"pgcluster.lan.:53"}
		p, cfg, err := parse(c)
		if tc.errPart == "" {
			if err != nil {
				t.Errorf("test %d: unexpected error %v", i, err)
				continue
			}
			if tc.check != nil {
				tc.check(t, p, cfg)
			}
			continue
		}
		if err == nil {
			t.Errorf("test %d: expected an error containing %q", i, tc.errPart)
			continue
		}
		if !strings.Contains(err.Error(), tc.errPart) {
			t.Errorf("test %d: error %q does not contain %q", i, err, tc.errPart)
		}
	}
}

// TestSetupOverlappingServerBlockZones refuses overlapping zones taken from
// the server block's keys, not only from the pgcluster line.
func TestSetupOverlappingServerBlockZones(t *testing.T) {
	c := caddy.NewTestController("dns", "pgcluster {\n postgres "+dsn+"\n}")
	c.ServerBlockKeys = []string{"pgcluster.lan.:53", "sub.pgcluster.lan.:53"}
	_, _, err := parse(c)
	if err == nil || !strings.Contains(err.Error(), `zones "pgcluster.lan." and "sub.pgcluster.lan." overlap`) {
		t.Fatalf("overlapping server block zones: %v", err)
	}
}

// TestSetupDSNErrorHidesPassword: a DSN that cannot be parsed is refused with
// the reason, never with the password.
func TestSetupDSNErrorHidesPassword(t *testing.T) {
	for _, d := range []string{
		"postgres://dns:s3cret@secrethost:notaport/registry",
		"postgres://dns:s3cret@secrethost/registry?sslmode=bogus",
		"postgres://dns:s3cr%zzet@secrethost/registry",
		`"host=secrethost password=s3cret port=abc"`,
		`"host=secrethost password='s3 cret' sslmode=bogus"`,
		`"password=s3cret sslmode=bogus"`,
	} {
		err := setup(caddy.NewTestController("dns", "pgcluster {\n postgres "+d+"\n}"))
		if err == nil {
			t.Errorf("%s: accepted", d)
			continue
		}
		if !strings.Contains(err.Error(), "postgres: the DSN cannot be used") || !strings.Contains(err.Error(), ":2 ") {
			t.Errorf("%s: the error should name the option and line 2: %v", d, err)
		}
		if strings.Contains(err.Error(), "s3") || strings.Contains(err.Error(), "secrethost") {
			t.Errorf("%s: the error shows the DSN: %v", d, err)
		}
	}
}

func TestSetupErrorNamesLine(t *testing.T) {
	for _, tc := range []struct{ input, opt, line string }{
		{"pgcluster {\n postgres " + dsn + "\n\n ttl never\n}", "ttl", ":4 "},
		{"pgcluster {\n postgres " + dsn + "\n ttl 5\n refresh 5s\n ttl 30\n}", "ttl: given twice", ":5 "},
		{"pgcluster {\n postgres " + dsn + "\n refresh 1ns\n}", "refresh", ":3 "},
		{"pgcluster a.lan sub.a.lan {\n postgres " + dsn + "\n}", "overlap", ":1 "},
	} {
		err := setup(caddy.NewTestController("dns", tc.input))
		if err == nil || !strings.Contains(err.Error(), tc.line) || !strings.Contains(err.Error(), tc.opt) || !strings.Contains(err.Error(), "pgcluster") {
			t.Errorf("error should name the plugin, %q and line %s: %v", tc.opt, tc.line, err)
		}
	}
}
