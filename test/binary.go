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

// coreDNSBinary builds cmd/coredns once per test run, as make build does,
// with the race detector when the tests run with it (make test), so that
// the fleet tests' separate processes are checked for races too; the
// fleet harness fails a test whose instance reports one. TestMain removes
// the binary when the run ends.
func coreDNSBinary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pgcluster-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "coredns")
		args := []string{"build", "-o", binPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		out, err := exec.Command("go", append(args, "../cmd/coredns")...).CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build ./cmd/coredns: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}
