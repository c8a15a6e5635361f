package discovery

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

const (
	// maxListed is how many failures an error about many of them spells
	// out; the rest are counted.
	maxListed = 2
	// maxFailureLen bounds the text of one failure within such an error.
	maxFailureLen = 120
)

// failures describes many failures in a bounded number of bytes, whatever
// their number: "a: why" for one, "all 1491 candidates failed; first: a:
// why; b: why; 1489 more" for many. what names the items ("candidates").
func failures(what string, items []string) string {
	switch len(items) {
	case 0:
		return "no " + what
	case 1:
		return clip(items[0])
	}
	var b strings.Builder
	fmt.Fprintf(&b, "all %d %s failed; first: ", len(items), what)
	for i, s := range items[:min(len(items), maxListed)] {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(clip(s))
	}
	if more := len(items) - maxListed; more > 0 {
		fmt.Fprintf(&b, "; %d more", more)
	}
	return b.String()
}

// clip cuts s to maxFailureLen bytes, on a character boundary, marking the
// cut with "...".
func clip(s string) string {
	if len(s) <= maxFailureLen {
		return s
	}
	cut := maxFailureLen - len("...")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// joined is errors.Join with a message of bounded length: the errors of
// several attempts at one thing, each about one of what.
type joined struct {
	what string
	errs []error
}

func (e *joined) Error() string {
	msgs := make([]string, len(e.errs))
	for i, err := range e.errs {
		msgs[i] = err.Error()
	}
	return failures(e.what, msgs)
}

func (e *joined) Unwrap() []error { return e.errs }
