package pgcluster

import (
	"bytes"
	"io"
	"sync"
	"testing"

	clog "github.com/coredns/coredns/plugin/pkg/log"
)

func init() { clog.Discard() }

var logMu sync.Mutex

// captureLog returns what the plugin logs until the test ends.
func captureLog(t *testing.T) *syncBuffer {
	t.Helper()
	logMu.Lock()
	b := &syncBuffer{}
	clog.SetOutput(b)
	t.Cleanup(func() {
		clog.SetOutput(io.Discard)
		logMu.Unlock()
	})
	return b
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
