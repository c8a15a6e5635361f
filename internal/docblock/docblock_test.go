package docblock

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	md := "# Doc\n\n<!-- test:top -->\n~~~ sh\necho one\necho two\n~~~\n\n" +
		"* an item:\n\n  <!-- test:item -->\n  ```sql\n  SELECT 1;\n    -- kept indented\n  ```\n\n" +
		"<!-- test:twice -->\n~~~ txt\na\n~~~\n<!-- test:twice -->\n~~~ txt\nb\n~~~\n" +
		"<!-- test:mixed -->\n~~~ txt\nc\n```\n"
	path := filepath.Join(t.TempDir(), "doc.md")
	if err := os.WriteFile(path, []byte(md), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, info, text, err string
	}{
		{name: "top", info: "sh", text: "echo one\necho two\n"},
		{name: "item", info: "sql", text: "SELECT 1;\n  -- kept indented\n"},
		{name: "absent", err: "no code block after <!-- test:absent -->"},
		{name: "twice", err: "2 code blocks marked"},
		{name: "mixed", err: "opens with ~~~ and closes with ```"},
	} {
		b, err := Read(path, tc.name)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if b.Info != tc.info || b.Text != tc.text {
			t.Errorf("%s: info %q text %q, want %q %q", tc.name, b.Info, b.Text, tc.info, tc.text)
		}
	}
}
