package lock

import (
	"testing"
	"time"
)

// The lock tests run against real redis-servers started with
// internal/redistest (redistest.Start).

// eventually waits until cond holds, failing t after d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
