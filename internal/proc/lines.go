package proc

import (
	"bytes"
	"io"
	"sync"
	"time"
)

// LineWriter writes each complete line it is given to W in one Write,
// after Prefix: the output of processes that write at once, interleaved
// by line and never within one. A line not ended yet waits for its end.
type LineWriter struct {
	W      io.Writer
	Prefix string
	// Stamp puts the time a line ended (15:04:05.000, local time) before
	// its Prefix: a process that does not stamp its lines (CoreDNS's log)
	// can be read beside another's.
	Stamp bool

	mu  sync.Mutex
	buf []byte
}

// Write implements io.Writer.
func (l *LineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		line := l.Prefix + string(l.buf[:i+1])
		if l.Stamp {
			line = time.Now().Format("15:04:05.000 ") + line
		}
		l.buf = l.buf[i+1:]
		if _, err := io.WriteString(l.W, line); err != nil {
			return len(p), err
		}
	}
}
