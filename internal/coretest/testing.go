package coretest

import (
	"context"
	"strings"
	"testing"
)

// Start starts an instance for the test (see StartNoWait) and waits until
// cfg.Ready says it is ready, within cfg.ReadyTimeout; one that exits
// because another process took a port first is started again on fresh
// ports. An instance that does not become ready fails the test.
func Start(t testing.TB, cfg Config) *Instance {
	t.Helper()
	in, err := launch(context.Background(), cfg, func() (*Instance, error) { return StartNoWait(t, cfg), nil })
	if err != nil {
		t.Fatalf("%s: %v (its log follows at cleanup)", in, err)
	}
	return in
}

// StartNoWait starts an instance for the test without waiting for it to
// answer (see StartProcess); a Corefile without Dir is written to a
// temporary directory of the test's. A failure fails the test. When the
// test ends the instance is thawed and stopped with SIGTERM, killed if it
// has not exited within cfg.StopTimeout; a data race it reported (when
// built with -race) fails the test, and its log is shown if the test
// failed.
func StartNoWait(t testing.TB, cfg Config) *Instance {
	t.Helper()
	if cfg.Command == nil && cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	in, err := StartProcess(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.Stop(); err != nil {
			t.Errorf("%s: %v", in, err)
		}
		if strings.Contains(in.Log(), "WARNING: DATA RACE") {
			t.Errorf("%s (built with -race) found a data race", in)
		}
		if t.Failed() {
			t.Logf("%s (pid %d), %s; its log:\n%s", in, in.Pid(), in.State(), in.StampedLog())
		}
	})
	return in
}
