package redistest

import (
	"strings"
	"testing"
)

// testLog sends each line to the test log, so that a failing test shows
// what its servers said.
type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}
