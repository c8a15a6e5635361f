package pgcluster

import (
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"

	"github.com/pgcluster/pgcluster/health"
)

func TestSetupCheckOptions(t *testing.T) {
	block := func(lines ...string) string {
		return "pgcluster {\n postgres " + dsn + "\n " + strings.Join(lines, "\n ") + "\n}"
	}
	tests := []optionCase{
		{block(), "", func(t *testing.T, cfg *settings) {
			if cfg.checksOn() || cfg.interval != 2*time.Second || cfg.timeout != time.Second || cfg.rise != 2 || cfg.fall != 2 || cfg.allDown != "open" || cfg.maxLag != 0 {
				t.Errorf("defaults: checks off, 2s, 1s, 2, 2, open; got %+v", cfg)
			}
		}},
		{block("check tcp"), "", func(t *testing.T, cfg *settings) {
			if cfg.check != checkTCP {
				t.Errorf("check %q", cfg.check)
			}
		}},
		{block(`check postgres "user=monitor dbname=postgres sslmode=prefer"`, "interval 500ms", "timeout 200ms", "rise 3", "fall 1", "max_lag 16MB", "all_down closed"), "", func(t *testing.T, cfg *settings) {
			if cfg.check != checkPostgres || cfg.checkOptions != "user=monitor dbname=postgres sslmode=prefer" || cfg.interval != 500*time.Millisecond ||
				cfg.timeout != 200*time.Millisecond || cfg.rise != 3 || cfg.fall != 1 || cfg.maxLag != 16<<20 || cfg.allDown != "closed" {
				t.Errorf("options: %+v", cfg)
			}
		}},
		{block("check postgres", "max_lag 1048576"), "", func(t *testing.T, cfg *settings) {
			if cfg.maxLag != 1<<20 || cfg.checkOptions != "" {
				t.Errorf("max_lag in bytes: %d", cfg.maxLag)
			}
		}},
		{block("check postgres", "max_lag 5s"), "", func(t *testing.T, cfg *settings) {
			if cfg.maxLagTime != 5*time.Second || cfg.maxLag != 0 || !cfg.healthConfig(nil).ReportWAL {
				t.Errorf("max_lag as a duration: %v, bytes %d", cfg.maxLagTime, cfg.maxLag)
			}
		}},
		{block("check postgres", "max_lag 0s"), "not a positive duration", nil},
		{block("check tcp", "max_lag 5s"), "max_lag needs check postgres", nil},
		{block("check tcp", "check off"), "check: given twice", nil},
		{block("check off"), "", func(t *testing.T, cfg *settings) {
			if cfg.checksOn() {
				t.Error("check off")
			}
		}},
		{block("check http"), `check: "http" is not tcp, postgres, passive or off`, nil},
		{block("check"), "Wrong argument count", nil},
		{block("check tcp user=x"), "check tcp: takes no options", nil},
		{block(`check postgres "host=db user=x"`), "host: host and port come from the registry", nil},
		{block(`check postgres "port=5433"`), "port: host and port come from the registry", nil},
		{block(`check postgres "postgres://x@db/y"`), "not a URL", nil},
		{block(`check postgres "user"`), `"user" is not key=value`, nil},
		{block(`check postgres "sslmode=bogus"`), "sslmode", nil},
		{block(`check postgres user=x dbname=y`), "one quoted string", nil},
		{block("check tcp", "interval 10ms"), "interval: 10ms is below the minimum of 100ms", nil},
		{block("check tcp", "timeout 1ms"), "timeout: 1ms is below the minimum of 10ms", nil},
		{block("check tcp", "interval 1s", "timeout 1s"), "timeout 1s must be shorter than interval 1s", nil},
		{block("check tcp", "rise 0"), `rise: "0" is not a count from 1 to 100`, nil},
		{block("check tcp", "fall many"), `fall: "many" is not a count`, nil},
		{block("check tcp", "max_lag 16MB"), "max_lag needs check postgres", nil},
		{block("check postgres", "max_lag -1"), "max_lag", nil},
		{block("check postgres", "max_lag 16XB"), "max_lag", nil},
		{block("check tcp", "all_down maybe"), "all_down: want open or closed", nil},

		// The switchover options.
		{block("check postgres"), "", func(t *testing.T, cfg *settings) {
			hc := cfg.healthConfig(nil)
			if cfg.splitBrain != splitBrainClosed || cfg.holdFor() != 5*time.Second || hc.RoleInterval != 0 {
				t.Errorf("defaults: split_brain closed, primary_hold 2 x 2s + 1s, role_interval health's default; got %q, %v, %v", cfg.splitBrain, cfg.holdFor(), hc.RoleInterval)
			}
		}},
		{block("check postgres", "role_interval 50ms", "split_brain newest_timeline", "primary_hold 3s"), "", func(t *testing.T, cfg *settings) {
			if cfg.roleInterval != 50*time.Millisecond || cfg.splitBrain != splitBrainNewestTimeline || cfg.holdFor() != 3*time.Second {
				t.Errorf("options: %v %q %v", cfg.roleInterval, cfg.splitBrain, cfg.holdFor())
			}
		}},
		{block("check postgres", "role_interval off", "primary_hold off"), "", func(t *testing.T, cfg *settings) {
			if cfg.healthConfig(nil).RoleInterval != health.NoSessions || cfg.holdFor() != 0 {
				t.Errorf("off: role_interval %v, primary_hold %v", cfg.roleInterval, cfg.holdFor())
			}
		}},
		{block("check postgres", "role_interval 1ms"), "role_interval: 1ms is below the minimum of 10ms", nil},
		{block("check postgres", "role_interval soon"), "role_interval", nil},
		{block("check tcp", "role_interval 100ms"), "role_interval needs check postgres", nil},
		{block("check postgres", "split_brain newest"), "split_brain: want closed or newest_timeline", nil},
		{block("check tcp", "split_brain newest_timeline"), "split_brain newest_timeline needs check postgres", nil},
		{block("primary_hold 5s"), "primary_hold needs a check", nil},
		{block("check tcp", "primary_hold forever"), "primary_hold", nil},

		// The probe budget: by default none alone, and with redis half the
		// nodes' probes a second, at least 200; a number, or off.
		{block("check tcp"), "", func(t *testing.T, cfg *settings) {
			if got := cfg.probeBudgetFor(1000); got != 0 {
				t.Errorf("default without redis: %v probes/s, want none", got)
			}
		}},
		{block("check tcp", "redis redis://127.0.0.1:6379"), "", func(t *testing.T, cfg *settings) {
			for nodes, want := range map[int]float64{0: 200, 300: 200, 1000: 250, 10000: 2500} {
				if got := cfg.probeBudgetFor(nodes); got != want {
					t.Errorf("default with redis, %d nodes at 2s: %v probes/s, want %v", nodes, got, want)
				}
			}
		}},
		{block("check tcp", "interval 500ms", "timeout 100ms", "redis redis://127.0.0.1:6379"), "", func(t *testing.T, cfg *settings) {
			if got := cfg.probeBudgetFor(1000); got != 1000 {
				t.Errorf("default with redis, 1000 nodes at 500ms: %v probes/s, want 1000", got)
			}
		}},
		{block("check tcp", "probe_budget 50", "redis redis://127.0.0.1:6379"), "", func(t *testing.T, cfg *settings) {
			if got := cfg.probeBudgetFor(10000); got != 50 {
				t.Errorf("probe_budget 50: %v probes/s", got)
			}
		}},
		{block("check postgres", "probe_budget off", "redis redis://127.0.0.1:6379"), "", func(t *testing.T, cfg *settings) {
			if got := cfg.probeBudgetFor(10000); got != 0 {
				t.Errorf("probe_budget off: %v probes/s", got)
			}
		}},
		{block("check tcp", "probe_budget 0"), "", func(t *testing.T, cfg *settings) {
			if cfg.probeBudget != 0 {
				t.Errorf("probe_budget 0: %d, want off", cfg.probeBudget)
			}
		}},
		{block("check tcp", "probe_budget 1000000"), "", nil},
		{block("check tcp", "probe_budget"), "Wrong argument count", nil},
		{block("check tcp", "probe_budget 50 100"), "Wrong argument count", nil},
		{block("check tcp", "probe_budget -1"), `probe_budget: "-1" is not a number of probes a second from 1 to 1000000, or off`, nil},
		{block("check tcp", "probe_budget 1000001"), "probe_budget", nil},
		{block("check tcp", "probe_budget 2.5"), "probe_budget", nil},
		{block("check tcp", "probe_budget many"), "probe_budget", nil},
		{block("probe_budget 50"), "probe_budget needs a check", nil},
		{block("probe_budget off"), "probe_budget needs a check", nil},
	}
	runOptionCases(t, tests)
}

// optionCase is a pgcluster block and what parsing it gives: an error
// containing errPart, or (errPart "") settings that check accepts.
type optionCase struct {
	input   string
	errPart string
	check   func(t *testing.T, cfg *settings)
}

// runOptionCases parses each case's block as setup does and checks it.
func runOptionCases(t *testing.T, tests []optionCase) {
	t.Helper()
	for i, tc := range tests {
		c := caddy.NewTestController("dns", tc.input)
		c.ServerBlockKeys = []string{"pgcluster.lan.:53"}
		_, cfg, err := parse(c)
		if tc.errPart == "" {
			if err != nil {
				t.Errorf("test %d: unexpected error %v", i, err)
			} else if tc.check != nil {
				tc.check(t, cfg)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.errPart) {
			t.Errorf("test %d: error %v, want one containing %q", i, err, tc.errPart)
		}
	}
}
