package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The plugin.cfg line that adds pgcluster to a CoreDNS build, and the line
// it goes before (README.md, "Use it in your own CoreDNS build").
const (
	pluginCfgLine   = "pgcluster:github.com/pgcluster/pgcluster"
	pluginCfgBefore = "file:file"
	// unpublished is the version a replaced module is required at.
	unpublished = "v0.0.0-00010101000000-000000000000"
)

// TestPluginCfgBuild builds CoreDNS the way its users add an external
// plugin: CoreDNS's own source (the version go.mod requires, from the module
// cache), pgcluster's line in plugin.cfg before file, the module pointed at
// this checkout, go generate, go get and go build as CoreDNS's Makefile
// does (CGO_ENABLED=0). The binary must list pgcluster, order it before
// file, and answer a query from a real registry.
func TestPluginCfgBuild(t *testing.T) {
	root := repoRoot(t)
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=", "CGO_ENABLED=0")
	start := time.Now()
	mod := strings.Fields(run(t, root, env, "go", "list", "-m", "-f", "{{.Version}} {{.Dir}}", "github.com/coredns/coredns"))
	if len(mod) != 2 {
		run(t, root, env, "go", "mod", "download", "github.com/coredns/coredns")
		mod = strings.Fields(run(t, root, env, "go", "list", "-m", "-f", "{{.Version}} {{.Dir}}", "github.com/coredns/coredns"))
	}
	if len(mod) != 2 {
		t.Fatalf("github.com/coredns/coredns is not in the module cache: %v", mod)
	}
	version, src := mod[0], mod[1]
	t.Logf("CoreDNS %s from %s", version, src)

	dir := filepath.Join(t.TempDir(), "coredns")
	if err := os.CopyFS(dir, os.DirFS(src)); err != nil {
		t.Fatalf("copy CoreDNS's source: %v", err)
	}
	cfg := filepath.Join(dir, "plugin.cfg")
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(pluginCfgBefore)+`$`).FindAllIndex(b, -1); len(n) != 1 {
		t.Fatalf("CoreDNS %s's plugin.cfg: want one line %q, found %d", version, pluginCfgBefore, len(n))
	}
	b = []byte(strings.Replace(string(b), "\n"+pluginCfgBefore+"\n", "\n"+pluginCfgLine+"\n"+pluginCfgBefore+"\n", 1))
	if err := os.WriteFile(cfg, b, 0o644); err != nil {
		t.Fatal(err)
	}

	run(t, dir, env, "go", "mod", "edit",
		"-replace", "github.com/pgcluster/pgcluster="+root,
		"-require", "github.com/pgcluster/pgcluster@"+unpublished)
	run(t, dir, env, "go", "generate", "coredns.go")
	run(t, dir, env, "go", "get")
	run(t, dir, env, "go", "build", "-o", "coredns", ".")
	bin := filepath.Join(dir, "coredns")
	t.Logf("built CoreDNS %s with pgcluster through plugin.cfg in %.1fs", version, time.Since(start).Seconds())

	// pgcluster is compiled in, and runs before file.
	plugins := run(t, dir, env, bin, "-plugins")
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
