package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// coreDNSBinary builds cmd/coredns once per test run, as make build does.
// TestMain removes it when the run ends.
func coreDNSBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pgcluster-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "coredns")
		out, err := exec.Command("go", "build", "-o", binPath, "../cmd/coredns").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/coredns: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}
