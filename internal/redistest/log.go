package redistest

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"
)

// lineWriter writes each complete line it is given to w in one Write, with
// a prefix naming the server.
type lineWriter struct {
	w      io.Writer
	prefix string

	mu  sync.Mutex
	buf []byte
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := l.prefix + string(l.buf[:i+1])
		l.buf = l.buf[i+1:]
		if _, err := io.WriteString(l.w, line); err != nil {
			return len(p), err
		}
	}
}

// testLog sends each line to the test log, so that a failing test shows
// what its servers said.
type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
