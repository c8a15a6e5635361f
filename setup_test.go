package pgcluster

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
)

func TestSetupParse(t *testing.T) {
	tests := []struct {
		input   string
		errPart string // "" means no error
		check   func(t *testing.T, p *PgCluster, cfg *config)
	}{
		{"pgcluster {\n postgres postgres://x@h/db\n}", "", func(t *testing.T, p *PgCluster, cfg *config) {
			if cfg.dsn != "postgres://x@h/db" || cfg.ttl != defaultTTL || cfg.refresh != defaultRefresh || cfg.staleAfter != 0 || cfg.allowLoopback {
				t.Errorf("defaults: %+v", cfg)
			}
			if len(p.Zones) != 1 || p.Zones[0] != "pgcluster.lan." {
				t.Errorf("zones from the server block: %v", p.Zones)
			}
		}},
		{"pgcluster a.lan b.lan {\n postgres dsn\n ttl 30\n refresh 2s\n stale_after 3s\n allow_loopback\n self pg1\n self local/pg2 192.0.2.7\n fallthrough\n}", "", func(t *testing.T, p *PgCluster, cfg *config) {
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
		{"pgcluster {\n postgres dsn\n stale_after off\n}", "", nil},
		{"pgcluster {\n ttl 5\n}", "missing required option 'postgres DSN'", nil},
		{"pgcluster {\n postgres\n}", "Wrong argument count", nil},
		{"pgcluster {\n postgres dsn\n ttl -1\n}", "ttl", nil},
		{"pgcluster {\n postgres dsn\n ttl 100000\n}", "ttl", nil},
		{"pgcluster {\n postgres dsn\n refresh 0\n}", "refresh", nil},
		{"pgcluster {\n postgres dsn\n refresh soon\n}", "refresh", nil},
		{"pgcluster {\n postgres dsn\n stale_after -1s\n}", "stale_after", nil},
		{"pgcluster {\n postgres dsn\n allow_loopback yes\n}", "Wrong argument count", nil},
		{"pgcluster {\n postgres dsn\n self\n}", "Wrong argument count", nil},
		{"pgcluster {\n postgres dsn\n self pg1 nope\n}", "self", nil},
		{"pgcluster {\n postgres dsn\n colour blue\n}", `unknown property "colour"`, nil},
		{"pgcluster {\n postgres dsn\n}\npgcluster {\n postgres dsn\n}", "only be used once", nil},
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

func TestSetupErrorNamesLine(t *testing.T) {
	c := caddy.NewTestController("dns", "pgcluster {\n postgres dsn\n\n ttl never\n}")
	err := setup(c)
	if err == nil || !strings.Contains(err.Error(), ":4 ") || !strings.Contains(err.Error(), "ttl") || !strings.Contains(err.Error(), "pgcluster") {
		t.Fatalf("error should name the plugin, the option and line 4: %v", err)
	}
}
