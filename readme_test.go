package pgcluster

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/coredns/caddy"
)

// TestReadmeCorefiles parses every pgcluster block of the Corefiles in
// README.md and Corefile.example, so the documentation cannot drift from the
// parser.
func TestReadmeCorefiles(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("Corefile.example")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)~~~ corefile\n(.*?)~~~").FindAllStringSubmatch(string(readme), -1)
	corefiles := []string{string(example)}
	for _, b := range blocks {
		corefiles = append(corefiles, b[1])
	}
	stanza := regexp.MustCompile(`(?s)\bpgcluster \{.*?\n\s*\}`)
	n := 0
	for _, cf := range corefiles {
		for _, s := range stanza.FindAllString(cf, -1) {
			n++
			c := caddy.NewTestController("dns", s)
			c.ServerBlockKeys = []string{"pgcluster.lan."}
			if _, _, err := parse(c); err != nil {
				t.Errorf("documented block does not parse: %v\n%s", err, s)
			}
		}
	}
	if n < 3 {
		t.Errorf("found %d pgcluster blocks in the documentation, want at least 3", n)
	}
	syntax := string(readme[strings.Index(string(readme), "## Syntax"):strings.Index(string(readme), "## The registry")])
	for _, opt := range []string{"postgres", "ttl", "refresh", "stale_after", "allow_loopback", "self", "fallthrough"} {
		if !strings.Contains(syntax, "`"+opt+"`") {
			t.Errorf("option %s is not documented under Syntax", opt)
		}
	}
}
