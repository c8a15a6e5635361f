package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/coredns/caddy"

	_ "github.com/pgcluster/pgcluster/plugin" // the build's plugin bundle, as bin/coredns has it
)

// deployCorefile is a Corefile of deploy/ and the environment it is meant to
// run with, from the example secrets next to it.
type deployCorefile struct {
	name string
	text string
	env  map[string]string
}

// imageEnv is the environment the image's own Corefile reads (README.md,
// "Container image").
var imageEnv = map[string]string{
	"PGCLUSTER_POSTGRES": "postgres://dns:CHANGE-ME@db.internal:5432/registry?sslmode=verify-full",
}

// systemdEnvFile holds the systemd service's secrets.
const systemdEnvFile = "systemd/pgcluster-coredns.env"

// deployCorefiles returns every Corefile of deploy/: the files named
// Corefile and the Corefile of the Kubernetes ConfigMap, each with its
// environment. A Corefile whose environment it does not know fails the test.
func deployCorefiles(t testing.TB) []deployCorefile {
	t.Helper()
	var out []deployCorefile
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "Corefile" {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		cf := deployCorefile{name: filepath.Join("deploy", path), text: string(b)}
		switch filepath.Dir(path) {
		case "image":
			cf.env = imageEnv
		case "systemd":
			cf.env = readEnvFile(t, systemdEnvFile)
		default:
			t.Fatalf("%s: a Corefile whose environment deployCorefiles does not know; add it there", cf.name)
		}
		out = append(out, cf)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ms := loadManifests(t)
	for _, m := range ms {
		if text, ok := m.Data["Corefile"]; ok && m.Kind == "ConfigMap" {
			out = append(out, deployCorefile{name: filepath.Join("deploy", m.file) + " (ConfigMap " + m.Metadata.Name + ")", text: text, env: k8sEnv(t, ms)})
		}
	}
	return out
}

// readEnvFile reads a systemd EnvironmentFile: KEY=VALUE lines, the value
// bare or double-quoted, # comments.
func readEnvFile(t testing.TB, name string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s:%d: not KEY=VALUE: %q", name, i+1, line)
		}
		if strings.HasPrefix(v, `"`) {
			if v, err = strconv.Unquote(v); err != nil {
				t.Fatalf("%s:%d: %s: bad quoting: %v", name, i+1, k, err)
			}
		}
		env[k] = v
	}
	return env
}

var envRef = regexp.MustCompile(`\{\$([A-Za-z0-9_]+)\}`)

// comment is a Corefile comment: # at the start of a line or after a blank.
var comment = regexp.MustCompile(`(?m)(^|\s)#.*$`)

// envRefs returns the environment variables a Corefile reads, sorted; those
// in comments are not read.
func envRefs(corefile string) []string {
	var names []string
	for _, m := range envRef.FindAllStringSubmatch(comment.ReplaceAllString(corefile, ""), -1) {
		if !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	slices.Sort(names)
	return names
}

// listeners are the ports a Corefile's server block and endpoints listen on.
type listeners struct{ dns, health, ready, metrics string }

// listenersOf reads the listeners of a Corefile with one server block.
func listenersOf(t testing.TB, corefile string) listeners {
	t.Helper()
	find := func(what, re string) string {
		m := regexp.MustCompile(re).FindAllStringSubmatch(corefile, -1)
		if len(m) != 1 {
			t.Fatalf("want one %s listener in the Corefile, found %d:\n%s", what, len(m), corefile)
		}
		return m[0][1]
	}
	return listeners{
		dns:     find("server block", `(?m)^\S*:(\d+) \{$`),
		health:  find("health", `(?m)^\s*health \S*:(\d+)\b`),
		ready:   find("ready", `(?m)^\s*ready \S*:(\d+)\b`),
		metrics: find("prometheus", `(?m)^\s*prometheus \S*:(\d+)\b`),
	}
}

// validate runs every directive of corefile through its plugin's own setup,
// as CoreDNS does at start-up, without starting a server: the real parser
// of every plugin, pgcluster's included.
func validate(t *testing.T, name, corefile string, env map[string]string) error {
	for k, v := range env {
		t.Setenv(k, v)
	}
	return caddy.ValidateAndExecuteDirectives(caddy.CaddyfileInput{
		Contents: []byte(corefile), Filepath: name, ServerTypeName: "dns",
	}, nil, true)
}

// TestDeployCorefiles runs every Corefile of deploy/ through the setup of
// every plugin it names, with the environment its example secrets give:
// the deployments' Corefiles cannot drift from the parsers, and every
// {$ENV} they read is one the deployment sets. Each is also checked to fail
// with an unknown pgcluster option, so the check reaches pgcluster's parser.
func TestDeployCorefiles(t *testing.T) {
	cfs := deployCorefiles(t)
	var names []string
	for _, cf := range cfs {
		names = append(names, cf.name)
	}
	for _, want := range []string{"deploy/image/Corefile", "deploy/systemd/Corefile", "deploy/kubernetes/configmap.yaml"} {
		if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, want) }) {
			t.Errorf("%s: not found among the Corefiles of deploy/ %v", want, names)
		}
	}
	for _, cf := range cfs {
		t.Run(cf.name, func(t *testing.T) {
			refs := envRefs(cf.text)
			for _, name := range refs {
				if _, ok := cf.env[name]; !ok {
					t.Errorf("reads {$%s}, which its environment does not set", name)
				}
			}
			if !strings.Contains(cf.text, "pgcluster {") {
				t.Fatal("no pgcluster block")
			}
			if err := validate(t, cf.name, cf.text, cf.env); err != nil {
				t.Fatalf("does not parse: %v\n%s", err, cf.text)
			}
			broken := strings.Replace(cf.text, "pgcluster {", "pgcluster {\n        no_such_option 1", 1)
			err := validate(t, cf.name, broken, cf.env)
			if err == nil || !strings.Contains(err.Error(), "no_such_option") {
				t.Errorf("with an unknown pgcluster option: %v, want an error naming it", err)
			}
		})
	}
}
