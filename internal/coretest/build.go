// Package coretest builds bin/coredns and runs instances of it, as separate
// processes on free loopback ports, for the tests and the demo: start one
// from a Corefile, wait until it answers, crash it (SIGKILL), freeze and
// thaw it (SIGSTOP, SIGCONT), stop it (SIGTERM), read its metrics and its
// log. The processes are internal/proc's: none outlives its parent.
package coretest

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Main packages a Build makes.
const (
	CoreDNS      = "github.com/pgcluster/pgcluster/cmd/coredns"
	Pgclusterctl = "github.com/pgcluster/pgcluster/cmd/pgclusterctl"
)

// Build is a go build of main packages, made once by the first test of a
// test binary that asks for it and shared by the others, into a temporary
// directory that Remove deletes (call it from TestMain). The zero value
// builds cmd/coredns as make build does.
type Build struct {
	// Packages are the main packages' import paths, built by one go build
	// into one directory (their links run at once); none: CoreDNS.
	Packages []string
	// Race builds with the race detector, so that a test's separate
	// processes are checked for races too.
	Race bool
	// Flags are more go build flags, such as -trimpath.
	Flags []string
	// Env is more environment for go build, such as CGO_ENABLED=0.
	Env []string

	once sync.Once
	dir  string
	err  error
}

// Binary returns the path of the first package's binary, building it
// first; a failed build fails the test.
func (b *Build) Binary(t testing.TB) string {
	t.Helper()
	return b.Path(t, path.Base(b.packages()[0]))
}

// Path returns the path of the binary named name (a package's last
// element), building the packages first; a failed build fails the test.
func (b *Build) Path(t testing.TB, name string) string {
	t.Helper()
	b.once.Do(func() { b.build(t) })
	if b.err != nil {
		t.Fatal(b.err)
	}
	return filepath.Join(b.dir, name)
}

// Remove deletes the built binaries.
func (b *Build) Remove() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

func (b *Build) packages() []string {
	if len(b.Packages) == 0 {
		return []string{CoreDNS}
	}
	return b.Packages
}

func (b *Build) build(t testing.TB) {
	t.Helper()
	if b.dir, b.err = os.MkdirTemp("", "pgcluster-coretest-bin-"); b.err != nil {
		return
	}
	args := append([]string{"build", "-o", b.dir + "/"}, b.Flags...)
	if b.Race {
		args = append(args, "-race")
	}
	args = append(args, b.packages()...)
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), b.Env...)
	began := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		b.err = fmt.Errorf("%s go %s: %v\n%s", strings.Join(b.Env, " "), strings.Join(args, " "), err, out)
		return
	}
	t.Logf("built %s in %v", strings.Join(b.packages(), " "), time.Since(began).Round(time.Millisecond))
}
