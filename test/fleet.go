package test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// Placeholders a fleet Corefile holds where the harness puts free ports.
const (
	PortPlaceholder    = "{PORT}"    // the DNS port (UDP and TCP)
	MetricsPlaceholder = "{METRICS}" // the prometheus plugin's port
)

// Limits of the fleet harness.
const (
	// fleetReadyTimeout bounds the wait for an instance's first SOA answer.
	fleetReadyTimeout = 30 * time.Second
	// fleetPollTimeout bounds one SOA query while waiting.
	fleetPollTimeout = 250 * time.Millisecond
	// fleetStarts is how many times StartFleetInstance tries fresh ports
	// when the instance exits because another process took one.
	fleetStarts = 3
)

// Instance is one bin/coredns process of a fleet.
type Instance struct {
	t       testing.TB
	addr    string // DNS, host:port
	metrics string // prometheus port, "" when the Corefile has none
	p       *proc.Process
	log     *proc.Buffer
}

// StartFleetInstance runs the built bin/coredns with corefile as a separate
// process and returns once it answers the SOA of Zone over UDP. corefile
// holds {PORT} where the DNS port goes and, optionally, {METRICS} where a
// prometheus port goes; both become free loopback ports. The instance's
// output is kept (Log) and shown when the test fails. When the test ends
// the instance is thawed and stopped with SIGTERM, killed if it has not
// exited within 15 s.
func StartFleetInstance(t testing.TB, corefile string) *Instance {
	t.Helper()
	for try := 1; ; try++ {
		in := StartFleetInstanceNoWait(t, corefile)
		err := in.waitReady(fleetReadyTimeout)
		if err == nil {
			return in
		}
		// A port free a moment ago may have been taken before CoreDNS bound it.
		if in.p.Exited() && strings.Contains(in.Log(), "address already in use") && try < fleetStarts {
			continue
		}
		t.Fatalf("coredns instance on %s: %v (its log follows at cleanup)", in.addr, err)
	}
}

// StartFleetInstanceNoWait is StartFleetInstance without the wait for the
// first answer: for an instance started while what it needs is down. See
// WaitReady.
func StartFleetInstanceNoWait(t testing.TB, corefile string) *Instance {
	t.Helper()
	if !strings.Contains(corefile, PortPlaceholder) {
		t.Fatalf("the fleet Corefile has no %s where the DNS port goes:\n%s", PortPlaceholder, corefile)
	}
	bin := coreDNSBinary(t)
	port, err := proc.FreeDNSPort()
	if err != nil {
		t.Fatal(err)
	}
	in := &Instance{t: t, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), log: &proc.Buffer{}}
	corefile = strings.ReplaceAll(corefile, PortPlaceholder, strconv.Itoa(port))
	if strings.Contains(corefile, MetricsPlaceholder) {
		mport, err := proc.FreeDNSPort()
		if err != nil {
			t.Fatal(err)
		}
		in.metrics = strconv.Itoa(mport)
		corefile = strings.ReplaceAll(corefile, MetricsPlaceholder, in.metrics)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-conf", conf)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = in.log, in.log
	in.p, err = proc.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := in.p.Stop(stopTimeout); err != nil {
			t.Errorf("coredns instance on %s: %v", in.addr, err)
		}
		if strings.Contains(in.Log(), "WARNING: DATA RACE") {
			t.Errorf("coredns instance on %s (built with -race) found a data race", in.addr)
		}
		if t.Failed() {
			t.Logf("coredns instance on %s (pid %d), %s; its log:\n%s", in.addr, in.p.Pid(), in.p.State(), in.Log())
		}
	})
	return in
}

// WaitReady waits until the instance answers the SOA of Zone over UDP,
// failing the test after timeout or as soon as the process exits.
func (in *Instance) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	if err := in.waitReady(timeout); err != nil {
		t.Fatalf("coredns instance on %s: %v (its log follows at cleanup)", in.addr, err)
	}
}

func (in *Instance) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := in.soa()
		if err == nil {
			return nil
		}
		if in.p.Exited() {
			return fmt.Errorf("exited before answering (%s)", in.p.State())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no SOA answer for %s after %v: %w", Zone, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// soa asks the instance for the SOA of Zone over UDP.
func (in *Instance) soa() error {
	m := new(dns.Msg)
	m.SetQuestion(Zone, dns.TypeSOA)
	c := &dns.Client{Net: "udp", Timeout: fleetPollTimeout}
	r, _, err := c.Exchange(m, in.addr)
	if err != nil {
		return err
	}
	if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
		return fmt.Errorf("SOA %s: %s with %d answers", Zone, dns.RcodeToString[r.Rcode], len(r.Answer))
	}
	if _, ok := r.Answer[0].(*dns.SOA); !ok {
		return fmt.Errorf("SOA %s: answer %v", Zone, r.Answer[0])
	}
	return nil
}

// Addr returns the instance's DNS address (UDP, and TCP on the same port).
func (in *Instance) Addr() string { return in.addr }

// MetricsURL returns the URL of the instance's prometheus metrics, "" when
// its Corefile has no {METRICS}.
func (in *Instance) MetricsURL() string {
	if in.metrics == "" {
		return ""
	}
	return "http://127.0.0.1:" + in.metrics + "/metrics"
}

// Pid returns the instance's process id.
func (in *Instance) Pid() int { return in.p.Pid() }

// Exited reports whether the process has exited.
func (in *Instance) Exited() bool { return in.p.Exited() }

// Log returns what the instance has written to stdout and stderr so far.
func (in *Instance) Log() string { return in.log.String() }

// Kill ends the instance with SIGKILL, as a crash, and waits until it is gone.
func (in *Instance) Kill() { in.p.Kill() }

// Term sends SIGTERM and waits up to 15 s for the instance to exit; one still
// there is killed and Term returns an error.
func (in *Instance) Term() error { return in.p.Stop(stopTimeout) }

// Freeze stops the instance with SIGSTOP and returns once it is stopped: it
// answers nothing, renews nothing. A failure fails the test.
func (in *Instance) Freeze() {
	in.t.Helper()
	if err := in.p.Freeze(); err != nil {
		in.t.Fatalf("freeze coredns instance on %s: %v", in.addr, err)
	}
}

// Thaw resumes a frozen instance with SIGCONT. A failure fails the test.
func (in *Instance) Thaw() {
	in.t.Helper()
	if err := in.p.Thaw(); err != nil {
		in.t.Fatalf("thaw coredns instance on %s: %v", in.addr, err)
	}
}
