// Package docblock reads the code blocks of the project's Markdown that a
// test runs as written: each is a fenced block right after a line
// "<!-- test:NAME -->", so a test finds the user's own lines by NAME and
// cannot drift from them into a paraphrase.
package docblock

import (
	"fmt"
	"os"
	"regexp"
	"strings"
)

// marked matches a marker line and the fenced block after it: the marker's
// name, the fence's indentation, its info string and its body. The fence is
// ~~~ or ```, indented as a list item's may be.
var marked = regexp.MustCompile("(?ms)^([ \\t]*)<!-- test:([a-z0-9-]+) -->\\n[ \\t]*(~~~|```)[ \\t]*([^\\n]*)\\n(.*?)^[ \\t]*(~~~|```)[ \\t]*$")

// Block is one marked code block.
type Block struct {
	Name string // the marker's NAME
	Info string // the fence's info string: sh, sql, corefile, console, txt
	Text string // the body, with the list item's indentation removed
}

// Read returns the block marked name in the Markdown file path. A missing
// block, or two with the same name, is an error naming the file.
func Read(path, name string) (Block, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Block{}, err
	}
	var found []Block
	for _, m := range marked.FindAllStringSubmatch(string(b), -1) {
		if m[2] != name {
			continue
		}
		if m[3] != m[6] {
			return Block{}, fmt.Errorf("%s: block %q opens with %s and closes with %s", path, name, m[3], m[6])
		}
		found = append(found, Block{Name: name, Info: strings.TrimSpace(m[4]), Text: dedent(m[5], m[1])})
	}
	switch len(found) {
	case 0:
		return Block{}, fmt.Errorf("%s: no code block after <!-- test:%s -->", path, name)
	case 1:
		return found[0], nil
	}
	return Block{}, fmt.Errorf("%s: %d code blocks marked <!-- test:%s -->, want one", path, len(found), name)
}

// dedent removes indent from the start of every line of text.
func dedent(text, indent string) string {
	if indent == "" {
		return text
	}
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		lines[i] = strings.TrimPrefix(l, indent)
	}
	return strings.Join(lines, "\n")
}
