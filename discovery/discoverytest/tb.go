package discoverytest

import (
	"fmt"
	"slices"
	"sync"
)

// TB is what the constructors need from a test: testing.T, testing.B and
// testing.F satisfy it, and so does a Scope.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
	Cleanup(func())
}

// Scope is a TB for code that has no test at hand, such as an example: it
// panics where a test would fail, and runs the cleanups on Close.
type Scope struct {
	mu       sync.Mutex
	cleanups []func()
}

// Helper does nothing.
func (s *Scope) Helper() {}

// Fatalf panics with the message.
func (s *Scope) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// Cleanup registers f to run on Close.
func (s *Scope) Cleanup(f func()) {
	s.mu.Lock()
	s.cleanups = append(s.cleanups, f)
	s.mu.Unlock()
}

// Close runs the cleanups, last registered first.
func (s *Scope) Close() {
	s.mu.Lock()
	fs := s.cleanups
	s.cleanups = nil
	s.mu.Unlock()
	for _, f := range slices.Backward(fs) {
		f()
	}
}
