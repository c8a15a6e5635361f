package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/proc"
)

// fleetSize is how many CoreDNS instances the demo runs.
const fleetSize = 3

// instance is one bin/coredns process of the demo fleet. Its Corefile is the
// fleet's, with its own loopback ports.
type instance struct {
	*coretest.Instance
	name string // coredns-1, coredns-2, …
	conf string // path of its Corefile
}

// port returns the instance's DNS port.
func (in *instance) port() string { return strconv.Itoa(in.DNS) }

// metricsPort returns the port of the instance's metrics.
func (in *instance) metricsPort() string { return strconv.Itoa(in.Metrics) }

// readyAddr returns the host:port of the instance's ready plugin.
func (in *instance) readyAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(in.Ready)) }

// startInstance starts bin/coredns with the fleet's Corefile in a
// directory of its own under tmp and returns once it answers prod.Z, with
// that answer. port 0 picks free ports (and fresh ones when another process
// takes one first); otherwise the DNS port is port, checked free by the
// caller. Its output goes to w, each line prefixed with its name. An
// instance that does not answer is stopped.
func startInstance(ctx context.Context, w io.Writer, bin, tmp, name string, port int, claims *coretest.Claims, c corefileConfig) (*instance, *dns.Msg, error) {
	dir := filepath.Join(tmp, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	in := &instance{name: name, conf: filepath.Join(dir, "Corefile")}
	var answer *dns.Msg
	var err error
	in.Instance, err = coretest.Launch(ctx, coretest.Config{
		Command: func(p coretest.Ports) (*exec.Cmd, error) {
			c.port = p.DNS
			c.metrics = net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Metrics))
			c.ready = net.JoinHostPort("127.0.0.1", strconv.Itoa(p.Ready))
			if err := os.WriteFile(in.conf, []byte(corefile(c)), 0o644); err != nil {
				return nil, err
			}
			cmd := exec.Command(bin, "-conf", in.conf)
			cmd.Dir = dir
			// Its own process group, so that Ctrl-C reaches the demo only and
			// the demo stops the instance; proc kills it should the demo die.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			return cmd, nil
		},
		DNSPort: port,
		Claims:  claims,
		Output:  &proc.LineWriter{W: w, Prefix: name + ": "},
		Ready: func(ci *coretest.Instance) (err error) {
			answer, err = probe(ci.Addr())
			return err
		},
		ReadyTimeout: answerTimeout,
		Poll:         50 * time.Millisecond,
		StopTimeout:  stopTimeout,
	})
	switch {
	case err == nil:
		return in, answer, nil
	case in.Instance == nil:
		return nil, nil, fmt.Errorf("start %s: %w", name, err)
	case errors.Is(err, coretest.ErrExited):
		return nil, nil, fmt.Errorf("%s exited before answering (%s); its output is above", name, in.State())
	case errors.Is(err, context.Canceled):
		return nil, nil, err
	case ctx.Err() != nil:
		return nil, nil, fmt.Errorf("%s did not answer prod.%s: %w", name, zone, err)
	default: // "after 30s: why"
		return nil, nil, fmt.Errorf("%s did not answer prod.%s: no answer from %s %w", name, zone, in.Addr(), err)
	}
}

// startFleet starts the fleet's instances (see startInstance) and returns
// them in order, with the first one's answer: the first alone, so that it
// is the one that takes the registry lease and follows PostgreSQL for the
// fleet, then the others at once. Its output names the binary as shown.
// port 0 gives each instance free ports; otherwise instance i has DNS port
// port+i. On error it also returns the instances that answered, for the
// caller to stop; the error names each instance that did not.
func startFleet(ctx context.Context, w io.Writer, bin, shown, tmp string, port int, c corefileConfig) ([]*instance, *dns.Msg, error) {
	fleet := make([]*instance, fleetSize)
	answers := make([]*dns.Msg, fleetSize)
	errs := make([]error, fleetSize)
	claims := &coretest.Claims{}
	startOne := func(i int) {
		name := "coredns-" + strconv.Itoa(i+1)
		p := 0
		if port != 0 {
			p = port + i
		}
		fleet[i], answers[i], errs[i] = startInstance(ctx, w, bin, tmp, name, p, claims, c)
	}
	fmt.Fprintf(w, "demo: starting coredns-1 %s\n", shown)
	startOne(0)
	if errs[0] == nil {
		var wg sync.WaitGroup
		for i := 1; i < fleetSize; i++ {
			fmt.Fprintf(w, "demo: starting coredns-%d %s\n", i+1, shown)
			wg.Go(func() { startOne(i) })
		}
		wg.Wait()
	}
	started := slices.DeleteFunc(fleet, func(in *instance) bool { return in == nil })
	if err := ctx.Err(); err != nil {
		return started, nil, err
	}
	if err := errors.Join(errs...); err != nil {
		return started, nil, err
	}
	return started, answers[0], nil
}

// stop asks the instance to shut down (SIGTERM), and kills it if it has
// not after stopTimeout.
func (in *instance) stop() error {
	if err := in.Stop(); err != nil {
		return fmt.Errorf("%s: %w", in.name, err)
	}
	return nil
}

// stopFleet stops every instance at once and returns once all are gone.
func stopFleet(fleet []*instance) error {
	errs := make([]error, len(fleet))
	var wg sync.WaitGroup
	for i, in := range fleet {
		wg.Go(func() { errs[i] = in.stop() })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Redis modes, as the redis_mode metric labels them.
const (
	modeCoordinated = "coordinated"
	modeLocal       = "local"
)

// fleetState is what an instance's metrics say of its part in the fleet.
type fleetState struct {
	mode   string // modeCoordinated or modeLocal; "" when unknown
	leases int    // leases held: the nodes it probes for the fleet
}

var metricsClient = &http.Client{Timeout: time.Second}

// readState reads an instance's redis_mode and redis_leases metrics.
func readState(in *instance) (fleetState, error) {
	var s fleetState
	resp, err := metricsClient.Get(in.MetricsURL())
	if err != nil {
		return s, fmt.Errorf("%s metrics: %w", in.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return s, fmt.Errorf("%s metrics: %s", in.name, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(name, "coredns_pgcluster_redis_mode{") && value == "1":
			_, m, _ := strings.Cut(name, `mode="`)
			s.mode, _, _ = strings.Cut(m, `"`)
		case strings.HasPrefix(name, "coredns_pgcluster_redis_leases{"):
			f, err := strconv.ParseFloat(value, 64)
			if err != nil {
				return s, fmt.Errorf("%s metrics: %s %q: %w", in.name, name, value, err)
			}
			s.leases = int(f)
		}
	}
	if err := sc.Err(); err != nil {
		return s, fmt.Errorf("%s metrics: %w", in.name, err)
	}
	// redis_leases appears once the instance has held a lease: none is 0.
	if s.mode == "" {
		return s, fmt.Errorf("%s metrics: no coredns_pgcluster_redis_mode (is redis in its Corefile?)", in.name)
	}
	return s, nil
}

// readStates reads the fleetState of every instance.
func readStates(fleet []*instance) ([]fleetState, error) {
	states := make([]fleetState, len(fleet))
	for i, in := range fleet {
		var err error
		if states[i], err = readState(in); err != nil {
			return states, err
		}
	}
	return states, nil
}

// settled reports, as an error, how the fleet differs from every instance
// in mode and, when coordinated, the leases adding up to nodes.
func settled(states []fleetState, mode string, nodes int) error {
	total := 0
	for i, s := range states {
		if s.mode != mode {
			return fmt.Errorf("coredns-%d is in mode %q, not %q", i+1, s.mode, mode)
		}
		total += s.leases
	}
	if mode == modeCoordinated && total != nodes {
		return fmt.Errorf("the instances hold %d leases, not one per node (%d)", total, nodes)
	}
	return nil
}

// waitMode polls the fleet's metrics until every instance is in mode and,
// when coordinated, their leases add up to nodes; or until timeout passes
// or ctx is done. It returns the states last read.
func waitMode(ctx context.Context, fleet []*instance, mode string, nodes int, timeout time.Duration) ([]fleetState, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		states, err := readStates(fleet)
		if err == nil {
			if err = settled(states, mode, nodes); err == nil {
				return states, nil
			}
		}
		select {
		case <-ctx.Done():
			return states, ctx.Err()
		case <-deadline.C:
			return states, fmt.Errorf("after %v: %w", timeout, err)
		case <-tick.C:
		}
	}
}

// describe renders the fleet's states as "coordinated; leases 1 + 1 + 1".
func describe(states []fleetState) string {
	modes := map[string]bool{}
	var ms, ls []string
	for _, s := range states {
		modes[s.mode] = true
		ms = append(ms, s.mode)
		ls = append(ls, strconv.Itoa(s.leases))
	}
	mode := strings.Join(ms, ", ")
	if len(modes) == 1 {
		mode = ms[0]
	}
	return mode + "; leases " + strings.Join(ls, " + ")
}
