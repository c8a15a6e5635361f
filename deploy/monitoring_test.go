package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v2"
)

// The files of deploy/monitoring/.
const (
	monitoringDir = "monitoring"
	rulesFile     = "pgcluster-rules.yml"
	rulesTestFile = "pgcluster-rules.test.yml"
	dashboardFile = "pgcluster-dashboard.json"
)

// ruleFile is a Prometheus rule file.
type ruleFile struct {
	Groups []ruleGroup `yaml:"groups"`
}

type ruleGroup struct {
	Name  string `yaml:"name"`
	Rules []rule `yaml:"rules"`
}

type rule struct {
	Record      string            `yaml:"record,omitempty"`
	Alert       string            `yaml:"alert,omitempty"`
	Expr        string            `yaml:"expr"`
	For         string            `yaml:"for,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty"`
}

// ruleTests is the part of a promtool test file the tests read.
type ruleTests struct {
	Tests []struct {
		Name       string `yaml:"name"`
		AlertTests []struct {
			EvalTime  string `yaml:"eval_time"`
			AlertName string `yaml:"alertname"`
			ExpAlerts []any  `yaml:"exp_alerts"`
		} `yaml:"alert_rule_test"`
	} `yaml:"tests"`
}

// promtool returns the path of promtool, failing the test when it is
// missing: the rules are tested with Prometheus's own tool.
func promtool(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool is not installed, and the alerting rules of deploy/monitoring/ are tested with it: " +
			"install Debian's prometheus package (apt-get install prometheus; make test runs scripts/setup.sh, which does)")
	}
	return p
}

// runPromtool runs promtool with args in dir and returns its combined
// output and whether it succeeded.
func runPromtool(t testing.TB, dir string, args ...string) (string, bool) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("promtool %s: %v", strings.Join(args, " "), err)
	}
	return string(out), err == nil
}

// loadRules reads the rule file, refusing a field a rule does not have (a
// misspelt annotations, say).
func loadRules(t testing.TB) ruleFile {
	t.Helper()
	var rf ruleFile
	readYAML(t, filepath.Join(monitoringDir, rulesFile), &rf, yaml.UnmarshalStrict)
	return rf
}

func readYAML(t testing.TB, name string, v any, unmarshal func([]byte, any) error) {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// alerts returns the alerting rules of rf, in order.
func (rf ruleFile) alerts() []rule {
	var out []rule
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

// TestAlertRules runs promtool check rules and promtool test rules on
// deploy/monitoring/.
func TestAlertRules(t *testing.T) {
	if out, ok := runPromtool(t, monitoringDir, "check", "rules", rulesFile); !ok {
		t.Fatalf("promtool check rules %s:\n%s", rulesFile, out)
	}
	out, ok := runPromtool(t, monitoringDir, "test", "rules", rulesTestFile)
	if !ok {
		t.Fatalf("promtool test rules %s:\n%s", rulesTestFile, out)
	}
	t.Logf("promtool test rules %s:\n%s", rulesTestFile, out)
}

// TestAlertRulesComplete checks that every alert says what needs a person
// (a severity, a summary, a description saying what to check) and that the
// promtool tests hold, for each, a case where it fires and one where it
// stays quiet, and name no alert the rules lack.
func TestAlertRulesComplete(t *testing.T) {
	rf := loadRules(t)
	var rt ruleTests
	readYAML(t, filepath.Join(monitoringDir, rulesTestFile), &rt, yaml.Unmarshal)
	firing, quiet := map[string]int{}, map[string]int{}
	for _, g := range rt.Tests {
		for _, at := range g.AlertTests {
			if len(at.ExpAlerts) > 0 {
				firing[at.AlertName]++
			} else {
				quiet[at.AlertName]++
			}
		}
	}
	alerts := rf.alerts()
	if len(alerts) < 10 {
		t.Fatalf("%s has %d alerts; expected every alert docs/operate.md lists (at least 10)", rulesFile, len(alerts))
	}
	names := map[string]bool{}
	for _, a := range alerts {
		names[a.Alert] = true
		switch sev := a.Labels["severity"]; sev {
		case "critical", "warning":
		default:
			t.Errorf("alert %s: severity %q, want critical or warning", a.Alert, sev)
		}
		if len(a.Annotations["summary"]) < 20 {
			t.Errorf("alert %s: summary %q is missing or too short to say what is wrong", a.Alert, a.Annotations["summary"])
		}
		if d := a.Annotations["description"]; len(d) < 150 || !whatToDo.MatchString(d) {
			t.Errorf("alert %s: the description must say, at length, what to check (%s); it is %q", a.Alert, whatToDo, d)
		}
		if firing[a.Alert] == 0 {
			t.Errorf("alert %s: %s has no case where it fires (an alert_rule_test with exp_alerts)", a.Alert, rulesTestFile)
		}
		if quiet[a.Alert] == 0 {
			t.Errorf("alert %s: %s has no case where it stays quiet (an alert_rule_test with exp_alerts: [])", a.Alert, rulesTestFile)
		}
	}
	for name := range firing {
		if !names[name] {
			t.Errorf("%s tests alert %s, which %s does not have", rulesTestFile, name, rulesFile)
		}
	}
	for name := range quiet {
		if !names[name] {
			t.Errorf("%s tests alert %s, which %s does not have: its quiet case passes for nothing", rulesTestFile, name, rulesFile)
		}
	}
}

// whatToDo is how a description starts telling what to check.
var whatToDo = regexp.MustCompile(`(?i)\b(check|find|fix|look for|run)\b`)

// conditions matches the comparisons of an alert's expression with a number.
var conditions = regexp.MustCompile(`\s*(==|!=|>=|<=|>|<)\s*[0-9.]+`)

// TestAlertTestsCatchBrokenRules breaks each alert in turn and checks that
// promtool test rules then fails on that alert: with its conditions removed
// (it matches every series), with an expression that never matches, and
// without its for (it fires while it should still be pending).
func TestAlertTestsCatchBrokenRules(t *testing.T) {
	testText, err := os.ReadFile(filepath.Join(monitoringDir, rulesTestFile))
	if err != nil {
		t.Fatal(err)
	}
	rf := loadRules(t)
	for _, a := range rf.alerts() {
		mutants := map[string]func(r *rule){
			"condition removed": func(r *rule) { r.Expr = conditions.ReplaceAllString(r.Expr, "") },
			"never matches":     func(r *rule) { r.Expr = "vector(1) < 0" },
		}
		if a.For != "" {
			mutants["for removed"] = func(r *rule) { r.For = "" }
		}
		for what, mutate := range mutants {
			t.Run(a.Alert+"/"+what, func(t *testing.T) {
				t.Parallel()
				broken := mutateAlert(t, rf, a.Alert, mutate)
				dir := t.TempDir()
				writeFile(t, filepath.Join(dir, rulesFile), broken)
				writeFile(t, filepath.Join(dir, rulesTestFile), testText)
				if out, ok := runPromtool(t, dir, "check", "rules", rulesFile); !ok {
					t.Fatalf("the broken rules do not even load, so the test would fail for another reason:\n%s", out)
				}
				out, ok := runPromtool(t, dir, "test", "rules", rulesTestFile)
				if ok {
					t.Fatalf("promtool test rules passes with alert %s broken (%s): its tests do not pin it down", a.Alert, what)
				}
				if !strings.Contains(out, "alertname: "+a.Alert+",") {
					t.Fatalf("promtool test rules fails, but not on alert %s:\n%s", a.Alert, out)
				}
			})
		}
	}
}

// mutateAlert returns the rule file rf with the alert named name changed by
// mutate, as YAML.
func mutateAlert(t testing.TB, rf ruleFile, name string, mutate func(*rule)) []byte {
	t.Helper()
	out := ruleFile{}
	found := false
	for _, g := range rf.Groups {
		g.Rules = slices.Clone(g.Rules)
		for i := range g.Rules {
			if g.Rules[i].Alert == name {
				mutate(&g.Rules[i])
				found = true
			}
		}
		out.Groups = append(out.Groups, g)
	}
	if !found {
		t.Fatalf("no alert %s", name)
	}
	b, err := yaml.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t testing.TB, name string, b []byte) {
	t.Helper()
	if err := os.WriteFile(name, b, 0o644); err != nil {
		t.Fatal(err)
	}
}
