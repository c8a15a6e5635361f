package pgcluster

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/coredns/caddy"

	"github.com/pgcluster/pgcluster/health"
)

// The segment options: where this instance runs, how the checks are
// scoped, a passive instance, the probes' source; and what cannot go
// together says why.
func TestSegmentOptions(t *testing.T) {
	const redis = "\n redis redis://127.0.0.1:1/0"
	tests := []struct {
		body, err string
		check     func(*testing.T, *settings)
	}{
		{"check tcp" + redis + "\n location eu-west EU-West-1A\n check_scope zone", "", func(t *testing.T, cfg *settings) {
			if cfg.location != (place{"eu-west", "eu-west-1a"}) || !cfg.segmented() || cfg.home() != "zone eu-west/eu-west-1a" {
				t.Errorf("location %v scope %q home %q", cfg.location, cfg.checkScope, cfg.home())
			}
			if p := cfg.segmentPrefix(cfg.home()); p != cfg.redisPrefix+"zone/eu-west/eu-west-1a:" {
				t.Errorf("segment prefix %q", p)
			}
		}},
		{"check tcp" + redis + "\n location eu-west\n check_scope region", "", func(t *testing.T, cfg *settings) {
			if cfg.home() != "region eu-west" {
				t.Errorf("home %q", cfg.home())
			}
		}},
		{"check tcp" + redis, "", func(t *testing.T, cfg *settings) {
			if cfg.checkScope != scopeFleet || cfg.segmented() || cfg.home() != "" || cfg.segmentPrefix("") != cfg.redisPrefix {
				t.Errorf("defaults: scope %q home %q", cfg.checkScope, cfg.home())
			}
		}},
		{"check passive" + redis, "", func(t *testing.T, cfg *settings) {
			if !cfg.passive || cfg.check != checkPostgres {
				t.Errorf("check passive: passive %v check %q", cfg.passive, cfg.check)
			}
		}},
		{"check tcp\n probe_source 127.0.0.21", "", func(t *testing.T, cfg *settings) {
			if cfg.probeSource != netip.MustParseAddr("127.0.0.21") || cfg.healthConfig(nil).Source != cfg.probeSource {
				t.Errorf("probe_source %v", cfg.probeSource)
			}
		}},
		{"check tcp" + redis + "\n check_scope zone", "check_scope zone needs location REGION ZONE", nil},
		{"check tcp" + redis + "\n location r\n check_scope zone", "check_scope zone needs location REGION ZONE with a zone", nil},
		{"check tcp\n location r a\n check_scope zone", "check_scope zone needs redis", nil},
		{"location r a" + redis + "\n check_scope zone", "check_scope zone needs a check", nil},
		{"check tcp" + redis + "\n check_scope world", `check_scope: "world" is not fleet, zone or region`, nil},
		{"check tcp" + redis + "\n location r_1 a", `location: region "r_1" is not a DNS label`, nil},
		{"check passive", "check passive needs redis", nil},
		{"check passive" + redis + "\n relay off", "check passive needs the relay", nil},
		{"check passive user=x" + redis, "check passive: takes no options", nil},
		{"check passive" + redis + "\n probe_source 127.0.0.2", "probe_source needs check tcp or check postgres", nil},
		{"probe_source 127.0.0.2", "probe_source needs check tcp or check postgres", nil},
		{"check tcp\n probe_source 0.0.0.0", "probe_source: 0.0.0.0 is not an address of this host", nil},
		{"check tcp\n probe_source db.example", `probe_source: "db.example" is not an IP address`, nil},
	}
	for _, tc := range tests {
		c := caddy.NewTestController("dns", "pgcluster example.lan {\n postgres "+dsn+"\n "+tc.body+"\n}")
		_, cfg, err := parse(c)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.body, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want one with %q", tc.body, err, tc.err)
		case tc.check != nil && err == nil:
			tc.check(t, cfg)
		}
	}
}

// The fleet's verdict on a node, for a segment without probers of its
// own: up when any segment with probers finds it up, else the first's.
func TestMergeViews(t *testing.T) {
	up, down := health.Verdict{State: health.Up}, health.Verdict{State: health.Down, Cause: "refused"}
	a := health.ViewOf(map[string]health.Verdict{"c/n1": down, "c/n2": up, "c/n3": down})
	b := health.ViewOf(map[string]health.Verdict{"c/n1": up, "c/n2": down})
	got := mergeViews([]health.View{a, b})
	if got.At("c/n1").State != health.Up || got.At("c/n2").State != health.Up || got.At("c/n3").Cause != "refused" || got.Len() != 3 {
		t.Errorf("merged: %v", got)
	}
	if got := mergeViews([]health.View{a}); got.At("c/n1").Cause != "refused" {
		t.Errorf("one view: %v", got)
	}
}

// A segment as _client's TXT and pgclusterctl -segment spell it.
func TestParseSegment(t *testing.T) {
	for in, want := range map[string]string{"zone:eu/EU-A": "zone eu/eu-a", "region:eu": "region eu", "zone:eu": "", "region:eu/a": "", "zone:eu/a_b": "", "world:eu": "", "": ""} {
		got, err := ParseSegment(in)
		if got != want || (err == nil) != (want != "") {
			t.Errorf("ParseSegment(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if p := SegmentPrefix("pgcluster:x:", "zone eu/a"); p != "pgcluster:x:zone/eu/a:" {
		t.Errorf("SegmentPrefix: %q", p)
	}
}
