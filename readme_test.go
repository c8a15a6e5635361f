package pgcluster

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"
)

// TestReadmeCorefiles parses every pgcluster block of the Corefiles in
// README.md, the guides in docs/ and Corefile.example, so the documentation
// cannot drift from the parser.
func TestReadmeCorefiles(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("Corefile.example")
	if err != nil {
		t.Fatal(err)
	}
	guides, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	corefiles := []string{string(example)}
	fence := regexp.MustCompile("(?s)~~~ corefile\n(.*?)~~~")
	for _, doc := range append([]string{"README.md"}, guides...) {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range fence.FindAllStringSubmatch(string(b), -1) {
			corefiles = append(corefiles, b[1])
		}
	}
	stanza := regexp.MustCompile(`(?s)\bpgcluster \{.*?\n\s*\}`)
	// CoreDNS replaces {$ENV} before a plugin sees its block; a test
	// controller does not, so the test does, with a value fit for a
	// password or a redis_secret.
	env := regexp.MustCompile(`\{\$[A-Za-z0-9_]+\}`)
	n := 0
	for _, cf := range corefiles {
		for _, s := range stanza.FindAllString(cf, -1) {
			n++
			s = env.ReplaceAllString(s, "from-the-environment-0123456789")
			c := caddy.NewTestController("dns", s)
			c.ServerBlockKeys = []string{"pgcluster.lan."}
			if _, _, err := parse(c); err != nil {
				t.Errorf("documented block does not parse: %v\n%s", err, s)
			}
		}
	}
	if n < 7 {
		t.Errorf("found %d pgcluster blocks in the documentation, want at least 7", n)
	}
	// Every option parseOption takes, read from its case labels, so that a
	// new option cannot go undocumented: named under the README's Syntax and
	// described in full among docs/reference.md's options.
	syntax := section(t, string(readme), "## Syntax")
	reference, err := os.ReadFile("docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	options := section(t, string(reference), "## Options")
	src, err := os.ReadFile("setup.go")
	if err != nil {
		t.Fatal(err)
	}
	body := string(src)[strings.Index(string(src), "func parseOption("):]
	body = body[:strings.Index(body, "\n}\n")]
	var opts []string
	for _, m := range regexp.MustCompile(`(?m)^\tcase (".*"):$`).FindAllStringSubmatch(body, -1) {
		for _, q := range regexp.MustCompile(`"([a-z_]+)"`).FindAllStringSubmatch(m[1], -1) {
			opts = append(opts, q[1])
		}
	}
	if len(opts) < 25 {
		t.Fatalf("found %d options in parseOption's case labels, want every one (at least 25): %v", len(opts), opts)
	}
	for _, opt := range opts {
		if !strings.Contains(syntax, "`"+opt+"`") {
			t.Errorf("option %s is not named under the README's Syntax", opt)
		}
		if !regexp.MustCompile("(?m)^\\* (.*, )?`" + opt + "`").MatchString(options) {
			t.Errorf("option %s is not described under docs/reference.md's Options", opt)
		}
	}
	for opt, floor := range map[string]time.Duration{"refresh": minRefresh, "stale_after": minStaleAfter} {
		doc := options[strings.Index(options, "* `"+opt+"`"):]
		if doc = doc[:strings.Index(doc[1:], "\n* ")+1]; !strings.Contains(doc, "at least **"+floor.String()+"**") {
			t.Errorf("docs/reference.md does not give the floor of %s, %s", opt, floor)
		}
	}
}

// TestReadmeLinks checks that every relative link in README.md,
// discovery/README.md and docs/*.md points to a file of the repository (and,
// with a #fragment into a Markdown file, to one of its headings), that no
// path they mention leaves the repository (users have only the repository),
// and that the README links every page of docs/.
func TestReadmeLinks(t *testing.T) {
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{"README.md", "discovery/README.md"}, docs...)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mention := regexp.MustCompile("(?:`|\\]\\()(\\.\\./[^`)\\s]*)")
	n := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mention.FindAllStringSubmatch(string(b), -1) {
			if p := filepath.Join(filepath.Dir(doc), m[1]); strings.HasPrefix(p, "..") {
				t.Errorf("%s mentions %s, outside the repository", doc, m[1])
			}
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			n++
			file, frag, _ := strings.Cut(target, "#")
			path := doc
			if file != "" {
				path = filepath.Join(filepath.Dir(doc), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links %s: %v", doc, target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !hasAnchor(t, path, frag) {
				t.Errorf("%s links %s: %s has no heading #%s", doc, target, path, frag)
			}
		}
	}
	if n == 0 {
		t.Error("found no relative links to check")
	}
	// Every guide is reached from the README.
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range docs {
		if strings.HasPrefix(doc, "docs/") && !strings.Contains(string(readme), "]("+doc+")") {
			t.Errorf("README.md does not link %s", doc)
		}
	}
}

// section returns the part of the Markdown text doc under heading (such as
// "## Syntax"), up to the next heading of the same level.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("no %q section", heading)
	}
	s := doc[i+len(heading)+2:]
	if j := strings.Index(s, "\n"+heading[:strings.Index(heading, " ")+1]); j >= 0 {
		s = s[:j]
	}
	return s
}

// hasAnchor reports whether the Markdown file at path has a heading whose
// GitHub anchor is frag.
func hasAnchor(t *testing.T, path, frag string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	drop := regexp.MustCompile(`[^\p{L}\p{N} _-]`)
	for _, line := range strings.Split(string(b), "\n") {
		h := strings.TrimLeft(line, "#")
		if len(h) == len(line) || !strings.HasPrefix(h, " ") {
			continue
		}
		slug := strings.ReplaceAll(drop.ReplaceAllString(strings.ToLower(strings.TrimSpace(h)), ""), " ", "-")
		if slug == frag {
			return true
		}
	}
	return false
}
