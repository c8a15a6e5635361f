package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/docblock"
)

// The guide whose plugin.cfg recipe TestPluginCfgBuild runs, the marked
// blocks it reads there, and where the recipe puts CoreDNS's source (its
// BUILD line, under $HOME).
const (
	shipGuide      = "../docs/ship.md"
	recipeBlock    = "plugincfg"
	goGetBlock     = "plugincfg-go-get"
	recipeBuildDir = "coredns-pgcluster"
)

// TestPluginCfgBuild runs the guide's recipe for adding pgcluster to a
// CoreDNS build, its own lines read from docs/ship.md, with sh -e from this
// checkout, HOME a temporary directory and the network off (GOPROXY=off,
// GOTOOLCHAIN=local): CoreDNS's source from the module cache, pgcluster's
// line in plugin.cfg, go generate, go get and go build as CoreDNS's
// Makefile does. go get must print exactly the upgrades the guide shows;
// the binary must list pgcluster, order it before file, and answer a query
// from a real registry.
func TestPluginCfgBuild(t *testing.T) {
	root := repoRoot(t)
	recipe, err := docblock.Read(shipGuide, recipeBlock)
	if err != nil {
		t.Fatal(err)
	}
	upgrades, err := docblock.Read(shipGuide, goGetBlock)
	if err != nil {
		t.Fatal(err)
	}
	if recipe.Info != "sh" {
		t.Fatalf("%s: the recipe's block is %q, want sh", shipGuide, recipe.Info)
	}

	home := t.TempDir()
	start := time.Now()
	cmd := exec.Command("sh", "-e", "-c", recipe.Text)
	cmd.Dir = root
	cmd.Env = recipeEnv(t, home)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the recipe of %s failed: %v\n%s\nits lines:\n%s", shipGuide, err, out, recipe.Text)
	}
	t.Logf("the recipe of %s built CoreDNS with pgcluster in %.1fs", shipGuide, time.Since(start).Seconds())

	// go get wrote what the guide says it writes, no more, no less.
	var printed []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, "go: upgraded ") {
			printed = append(printed, l)
		}
	}
	want := strings.Split(strings.TrimSpace(upgrades.Text), "\n")
	if !slices.Equal(printed, want) {
		t.Errorf("go get printed\n%s\nthe guide shows\n%s", strings.Join(printed, "\n"), strings.Join(want, "\n"))
	}

	// The recipe's last line, ./coredns -plugins | grep pgcluster, printed
	// the plugin's bare name; and the binary lists it.
	dir := filepath.Join(home, recipeBuildDir)
	bin := filepath.Join(dir, "coredns")
	if !regexp.MustCompile(`(?m)^pgcluster$`).Match(out) {
		t.Errorf("the recipe's output has no line pgcluster:\n%s", out)
	}
	plugins := run(t, dir, cmd.Env, bin, "-plugins")
	if !regexp.MustCompile(`(?m)^\s*(dns\.)?pgcluster$`).MatchString(plugins) {
		t.Errorf("%s -plugins does not list pgcluster:\n%s", bin, plugins)
	}
	directives, err := os.ReadFile(filepath.Join(dir, "core/dnsserver/zdirectives.go"))
	if err != nil {
		t.Fatal(err)
	}
	pg, file := strings.Index(string(directives), `"pgcluster",`), strings.Index(string(directives), `"file",`)
	if pg < 0 || file < 0 || pg > file {
		t.Errorf("generated directives: pgcluster at %d, file at %d: want pgcluster before file", pg, file)
	}

	reg := registry(t)
	in := runCoreDNS(t, func(p ports) (*exec.Cmd, error) {
		conf := filepath.Join(t.TempDir(), "Corefile")
		corefile := fmt.Sprintf("%s:%d {\n    bind 127.0.0.1\n    pgcluster {\n        postgres postgres://postgres@%s:%d/postgres\n    }\n}\n",
			Zone, p.DNS, reg.Host, reg.Port)
		return exec.Command(bin, "-conf", conf), os.WriteFile(conf, []byte(corefile), 0o644)
	})
	in.waitAddrs(t, "primary.local."+Zone, testNodeAddr)
	reg.MustExec(t, "UPDATE pgcluster_nodes SET address = '192.0.2.20'")
	in.waitAddrs(t, "primary.local."+Zone, "192.0.2.20")
}

// recipeEnv is the environment the recipe runs in: this one with HOME
// moved to home, the Go caches and settings kept where they are (they
// would otherwise follow HOME), and nothing that reaches the network:
// no module proxy and no toolchain download; the checksum database is
// left as it is by default, so a lookup there would fail the recipe.
func recipeEnv(t *testing.T, home string) []string {
	t.Helper()
	out, err := exec.Command("go", "env", "-json", "GOMODCACHE", "GOCACHE", "GOPATH", "GOENV").Output()
	if err != nil {
		t.Fatalf("go env: %v", err)
	}
	var goenv map[string]string
	if err := json.Unmarshal(out, &goenv); err != nil {
		t.Fatalf("go env: %v", err)
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains([]string{"HOME", "GOFLAGS", "GOPROXY", "GOSUMDB", "GOWORK", "GOTOOLCHAIN", "CGO_ENABLED"}, name)
	})
	env = append(env, "HOME="+home, "GOFLAGS=", "GOPROXY=off", "GOWORK=off", "GOTOOLCHAIN=local")
	for k, v := range goenv {
		env = append(env, k+"="+v)
	}
	return env
}
