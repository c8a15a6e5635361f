package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The systemd unit and where it expects what it runs.
const (
	unitFile     = "systemd/pgcluster-coredns.service"
	unitBinary   = "/usr/local/bin/coredns"
	unitEnvFile  = "/etc/pgcluster/coredns.env"
	maxExposure  = "20" // systemd-analyze security's threshold: 2.0 on its 0-10 scale
	unitExecLine = "ExecStart=" + unitBinary + " -conf " + corefilePath
)

// readUnit returns the unit's settings: each key's values in order, comments
// and section headers left out.
func readUnit(t testing.TB) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	kv := map[string][]string{}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' || line[0] == ';' || line[0] == '[' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: not KEY=VALUE: %q", unitFile, line)
		}
		kv[k] = append(kv[k], v)
	}
	return kv
}

// TestSystemdUnit checks the hardening the unit promises (an unprivileged
// dynamic user with CAP_NET_BIND_SERVICE only, a read-only file system,
// restart on failure, the Corefile and secrets where README.md says), then
// runs systemd-analyze verify on it and systemd-analyze security, whose
// exposure must stay at most 2.0. Without systemd-analyze the test fails
// in CI (CI set) and is skipped elsewhere; scripts/setup.sh installs it.
func TestSystemdUnit(t *testing.T) {
	kv := readUnit(t)
	want := map[string]string{
		"ExecStart":               strings.TrimPrefix(unitExecLine, "ExecStart="),
		"EnvironmentFile":         unitEnvFile,
		"DynamicUser":             "yes",
		"AmbientCapabilities":     "CAP_NET_BIND_SERVICE",
		"CapabilityBoundingSet":   "CAP_NET_BIND_SERVICE",
		"NoNewPrivileges":         "yes",
		"ProtectSystem":           "strict",
		"ProtectHome":             "yes",
		"PrivateTmp":              "yes",
		"Restart":                 "on-failure",
		"RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX AF_NETLINK",
	}
	for k, v := range want {
		if got := kv[k]; !slices.Equal(got, []string{v}) {
			t.Errorf("%s: %s=%v, want %s=%s", unitFile, k, got, k, v)
		}
	}

	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("systemd-analyze not found, and CI is set: install systemd (scripts/setup.sh does)")
		}
		t.Skip("systemd-analyze not found: install systemd (scripts/setup.sh does) to verify the unit")
	}
	// verify checks that ExecStart's command exists: point it at a real
	// coredns, the unit otherwise unchanged.
	text, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(string(text), unitExecLine) != 1 {
		t.Fatalf("%s: want the line %s once", unitFile, unitExecLine)
	}
	unit := filepath.Join(t.TempDir(), filepath.Base(unitFile))
	tested := strings.Replace(string(text), unitExecLine, "ExecStart="+coreDNSBuild.Binary(t)+" -conf "+corefilePath, 1)
	if err := os.WriteFile(unit, []byte(tested), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(analyze, "verify", unit).CombinedOutput()
	if err != nil || len(out) > 0 {
		t.Errorf("systemd-analyze verify: %v\n%s", err, out)
	}
	out, err = exec.Command(analyze, "security", "--offline=true", "--threshold="+maxExposure, unit).CombinedOutput()
	i := strings.Index(string(out), "Overall exposure level")
	if err != nil || i < 0 {
		t.Errorf("systemd-analyze security (threshold %s): %v\n%s", maxExposure, err, out)
	} else {
		t.Logf("systemd-analyze security: %s", strings.TrimSpace(string(out[i:])))
	}
}
