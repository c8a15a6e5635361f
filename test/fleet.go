package test

import (
	"sync"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/coretest"
)

// coreDNSBuild is bin/coredns, built once per test run as make build does,
// with the race detector when the tests run with it (make test), so that
// the fleet tests' separate processes are checked for races too; the fleet
// harness fails a test whose instance reports one. TestMain removes it.
var coreDNSBuild = coretest.Build{Race: raceEnabled}

// Placeholders a fleet Corefile holds where the harness puts free ports.
const (
	PortPlaceholder    = coretest.PortPlaceholder    // the DNS port (UDP and TCP)
	MetricsPlaceholder = coretest.MetricsPlaceholder // the prometheus plugin's port
)

// Limits of the fleet harness.
const (
	// fleetReadyTimeout bounds the wait for an instance's first SOA answer.
	fleetReadyTimeout = 30 * time.Second
	// fleetPollTimeout bounds one SOA query while waiting.
	fleetPollTimeout = 250 * time.Millisecond
)

// Instance is one bin/coredns process of a fleet.
type Instance struct {
	*coretest.Instance
	t testing.TB
}

// fleetConfig is how the fleet harness starts an instance with corefile.
func fleetConfig(t testing.TB, corefile string) coretest.Config {
	return coretest.Config{
		Binary:       coreDNSBuild.Binary(t),
		Corefile:     corefile,
		Ready:        coretest.SOA(Zone, fleetPollTimeout),
		ReadyTimeout: fleetReadyTimeout,
		StopTimeout:  stopTimeout,
	}
}

// StartFleetInstance runs the built bin/coredns with corefile as a separate
// process and returns once it answers the SOA of Zone over UDP. corefile
// holds {PORT} where the DNS port goes and, optionally, {METRICS} where a
// prometheus port goes; both become free loopback ports (fresh ones when
// another process takes one first). The instance's output is kept (Log) and
// shown when the test fails. When the test ends the instance is thawed and
// stopped with SIGTERM, killed if it has not exited within 15 s.
func StartFleetInstance(t testing.TB, corefile string) *Instance {
	t.Helper()
	return &Instance{Instance: coretest.Start(t, fleetConfig(t, corefile)), t: t}
}

// StartFleetInstanceNoWait is StartFleetInstance without the wait for the
// first answer: for an instance started while what it needs is down. See
// WaitReady.
func StartFleetInstanceNoWait(t testing.TB, corefile string) *Instance {
	t.Helper()
	return &Instance{Instance: coretest.StartNoWait(t, fleetConfig(t, corefile)), t: t}
}

// WaitReady waits until the instance answers the SOA of Zone over UDP,
// failing the test after timeout or as soon as the process exits.
func (in *Instance) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := in.Wait(timeout, func() error { return coretest.SOA(Zone, fleetPollTimeout)(in.Instance) }); err != nil {
		t.Fatalf("coredns instance on %s: %v (its log follows at cleanup)", in.Addr(), err)
	}
}

// Term sends SIGTERM and waits up to 15 s for the instance to exit; one still
// there is killed and Term returns an error.
func (in *Instance) Term() error { return in.Stop() }

// Freeze stops the instance with SIGSTOP and returns once it is stopped: it
// answers nothing, renews nothing. A failure fails the test.
func (in *Instance) Freeze() {
	in.t.Helper()
	if err := in.Instance.Freeze(); err != nil {
		in.t.Fatalf("freeze coredns instance on %s: %v", in.Addr(), err)
	}
}

// Thaw resumes a frozen instance with SIGCONT. A failure fails the test.
func (in *Instance) Thaw() {
	in.t.Helper()
	if err := in.Instance.Thaw(); err != nil {
		in.t.Fatalf("thaw coredns instance on %s: %v", in.Addr(), err)
	}
}

// StartTogether starts an instance of each Corefile at once, as a fleet's
// hosts boot, and returns them, in the order of corefiles, once each
// answers.
func StartTogether(t testing.TB, corefiles ...string) []*Instance {
	t.Helper()
	ins := make([]*Instance, len(corefiles))
	var wg sync.WaitGroup
	for i, c := range corefiles {
		wg.Go(func() { ins[i] = StartFleetInstanceNoWait(t, c) })
	}
	wg.Wait()
	for _, in := range ins {
		in.WaitReady(t, fleetReadyTimeout)
	}
	return ins
}
