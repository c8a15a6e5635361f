// Package logtest captures what CoreDNS and its plugins log (clog writes
// through the standard log package), for tests that assert on log lines.
package logtest

import (
	"io"
	"log"
	"strings"
	"sync"
	"testing"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// Buffer collects log output; it is safe for concurrent use.
type Buffer struct {
	proc.Buffer
}

// Line returns the first line logged so far that holds every one of
// parts, and whether there is one.
func (l *Buffer) Line(parts ...string) (string, bool) {
	for line := range strings.SplitSeq(l.String(), "\n") {
		ok := true
		for _, p := range parts {
			ok = ok && strings.Contains(line, p)
		}
		if ok {
			return line, true
		}
	}
	return "", false
}

// one capture at a time: the log's output is process-wide.
var mu sync.Mutex

// Capture sends the log to a new Buffer until the test ends, then to
// restore. A failed test shows what was logged.
func Capture(t testing.TB, restore io.Writer) *Buffer {
	t.Helper()
	mu.Lock()
	buf := &Buffer{}
	log.SetOutput(buf)
	t.Cleanup(func() {
		log.SetOutput(restore)
		mu.Unlock()
		if t.Failed() {
			t.Logf("log:\n%s", buf)
		}
	})
	return buf
}
