package pgcluster

import (
	"go/ast"
	"go/parser"
	"go/token"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/coredns/caddy"
)

// TestUnknownOptionSuggests checks what a misspelt option reads like: the
// nearest option pgcluster knows, when one is near enough to be meant, and
// no guess when none is.
func TestUnknownOptionSuggests(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"intervall 5s", `unknown property "intervall"; did you mean "interval"?`},
		{"allow-loopback", `unknown property "allow-loopback"; did you mean "allow_loopback"?`},
		{"stale-after 10s", `unknown property "stale-after"; did you mean "stale_after"?`},
		{"TTL 30", `unknown property "TTL"; did you mean "ttl"?`},
		{"redis_prefx pg", `unknown property "redis_prefx"; did you mean "redis_prefix"?`},
		{"fall_through", `unknown property "fall_through"; did you mean "fallthrough"?`},
		{"primaryhold 5s", `unknown property "primaryhold"; did you mean "primary_hold"?`},
		{"tiemout 1s", `unknown property "tiemout"; did you mean "timeout"?`},
		{"colour blue", `unknown property "colour"` + "\n"},
		{"x 1", `unknown property "x"` + "\n"},
	} {
		c := caddy.NewTestController("dns", "pgcluster {\n postgres "+dsn+"\n "+tc.line+"\n}")
		_, _, err := parse(c)
		if err == nil {
			t.Errorf("%s: parsed", tc.line)
			continue
		}
		// A "\n" in want stands for the end of the message.
		got := err.Error() + "\n"
		if !strings.Contains(got, tc.want) || strings.Count(got, "did you mean") > 1 {
			t.Errorf("%s:\n got %q\nwant %q", tc.line, err, tc.want)
		}
	}
}

// TestOptionNamesAreTheParsers checks that optionNames, which suggestions
// are drawn from, holds exactly the options parseOption's case labels take,
// so that a new option is suggested and a removed one never is.
func TestOptionNamesAreTheParsers(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "setup.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var labels []string
	ast.Inspect(f, func(n ast.Node) bool {
		fn, ok := n.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "parseOption" {
			return true
		}
		var sw *ast.SwitchStmt
		for _, s := range fn.Body.List {
			if s, ok := s.(*ast.SwitchStmt); ok && s.Tag != nil && s.Tag.(*ast.Ident).Name == "opt" {
				sw = s
			}
		}
		if sw == nil {
			t.Fatal("parseOption has no switch opt")
		}
		for _, s := range sw.Body.List {
			for _, e := range s.(*ast.CaseClause).List {
				v, err := strconv.Unquote(e.(*ast.BasicLit).Value)
				if err != nil {
					t.Fatal(err)
				}
				labels = append(labels, v)
			}
		}
		return false
	})
	if len(labels) < 25 {
		t.Fatalf("found %d case labels in parseOption, want every option (at least 25): %v", len(labels), labels)
	}
	got, want := slices.Sorted(slices.Values(optionNames)), slices.Sorted(slices.Values(labels))
	if !slices.Equal(got, want) {
		t.Errorf("optionNames %v\nparseOption takes %v", got, want)
	}
}
