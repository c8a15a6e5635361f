package ratelog

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

type lines struct {
	mu  sync.Mutex
	got []string
}

func (l *lines) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, fmt.Sprintf(format, args...))
}

// One line per kind per period, whatever the input: the held-back lines
// are counted in the next one written.
func TestLimiter(t *testing.T) {
	var out lines
	l := New(out.logf, time.Minute)
	now := time.Unix(1000, 0)
	l.now = func() time.Time { return now }
	for i := range 9800 {
		l.Logf("malformed", "malformed message %d", i)
	}
	l.Logf("unsigned", "unsigned status")
	if len(out.got) != 2 {
		t.Fatalf("9,800 malformed and 1 unsigned: %d lines, want 2: %q", len(out.got), out.got)
	}
	now = now.Add(59 * time.Second)
	if l.Logf("malformed", "malformed again") {
		t.Fatal("a line of a kind written 59 s ago was written")
	}
	now = now.Add(time.Second)
	if !l.Logf("malformed", "malformed at last") {
		t.Fatal("a line of a kind written a minute ago was held back")
	}
	last := out.got[len(out.got)-1]
	if !strings.HasPrefix(last, "malformed at last") || !strings.Contains(last, "and 9800 more") {
		t.Fatalf("line after a minute = %q, want the count of the 9,800 held back", last)
	}
}

// Kinds named from input do not grow without bound.
func TestLimiterKindsBounded(t *testing.T) {
	var out lines
	l := New(out.logf, time.Minute)
	for i := range 10 * maxKinds {
		l.Logf(fmt.Sprint(i), "line")
	}
	if n := len(l.kinds); n > maxKinds {
		t.Fatalf("%d kinds remembered, want at most %d", n, maxKinds)
	}
}

// Concurrent use is safe (run with -race).
func TestLimiterConcurrent(t *testing.T) {
	var out lines
	l := New(out.logf, time.Hour)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				l.Logf("k", "x")
			}
		})
	}
	wg.Wait()
	if len(out.got) != 1 {
		t.Fatalf("%d lines from 8,000 of one kind in an hour, want 1", len(out.got))
	}
}
