package coretest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// Placeholders a Config's Corefile holds where free ports go.
const (
	PortPlaceholder    = "{PORT}"    // the DNS port (UDP and TCP)
	MetricsPlaceholder = "{METRICS}" // the prometheus plugin's port
	HealthPlaceholder  = "{HEALTH}"  // the health plugin's port
	ReadyPlaceholder   = "{READY}"   // the ready plugin's port
)

// Defaults of a Config.
const (
	// StopTimeout bounds the wait for an instance to exit after SIGTERM.
	StopTimeout = 15 * time.Second
	// pollInterval is how often a wait tries its condition.
	pollInterval = 20 * time.Millisecond
	// starts is how many times an instance on free ports is started on
	// fresh ones when it exits because another process took a port
	// before CoreDNS bound it.
	starts = 3
)

// ErrExited is the error of a wait that ended because the instance exited.
var ErrExited = errors.New("coredns exited")

// portTaken is what CoreDNS logs when a port it is to listen on is taken.
var portTaken = []byte("address already in use")

// Config says how to start an instance.
type Config struct {
	// Name names the instance in errors and logs; "": "coredns on" its
	// DNS address.
	Name string

	// Binary is the bin/coredns to run (see Build), with -conf and a
	// Corefile written from Corefile into Dir, where it runs.
	Binary   string
	Corefile string // holds PortPlaceholder and, optionally, the others
	Dir      string // "": a test's temporary directory (Start)
	// Command, instead of Binary, Corefile and Dir, returns the command
	// to run for ports, its Corefile written. Every port is in use.
	Command func(p Ports) (*exec.Cmd, error)

	// DNSPort is the DNS port; 0 picks a free one, and fresh ones when
	// another process takes one first.
	DNSPort int
	// Claims are the ports given out already, shared by instances started
	// at once; nil: the instance's own.
	Claims *Claims
	// Output gets what the instance writes to stdout and stderr; nil:
	// it is kept, and Log returns it.
	Output io.Writer

	// Ready says whether a starting instance is ready; ReadyTimeout bounds
	// the wait for it.
	Ready        func(in *Instance) error
	ReadyTimeout time.Duration
	// Poll is how often a wait tries its condition; 0: every 20 ms.
	Poll time.Duration
	// StopTimeout bounds Stop's wait for the instance to exit after
	// SIGTERM; 0: StopTimeout.
	StopTimeout time.Duration
}

// Instance is a running (or exited) bin/coredns process.
type Instance struct {
	// Ports are its ports; those its Corefile holds no placeholder for
	// are 0.
	Ports
	cfg Config
	p   *proc.Process
	// log is the output, stamped the same with each line's time (see
	// StampedLog); both nil when cfg.Output has the output.
	log, stamped *proc.Buffer
	out          *watch
}

// StartProcess starts an instance on free ports (see FreePorts) without
// waiting for it to answer.
func StartProcess(cfg Config) (*Instance, error) {
	if cfg.Claims == nil {
		cfg.Claims = &Claims{}
	}
	ports, err := FreePorts(cfg.DNSPort, cfg.Claims)
	if err != nil {
		return nil, err
	}
	in := &Instance{Ports: ports, cfg: cfg, out: &watch{w: cfg.Output}}
	if in.out.w == nil {
		in.log, in.stamped = &proc.Buffer{}, &proc.Buffer{}
		in.out.w = io.MultiWriter(in.log, &proc.LineWriter{W: in.stamped, Stamp: true})
	}
	command := cfg.Command
	if command == nil {
		command = in.corefileCommand
	}
	cmd, err := command(ports)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = in.out, in.out
	if in.p, err = proc.Start(cmd); err != nil {
		return nil, err
	}
	return in, nil
}

// corefileCommand writes cfg.Corefile with its placeholders replaced by p
// to cfg.Dir and returns the command that runs cfg.Binary on it. A port
// the Corefile has no placeholder for is unused, 0 in in.Ports.
func (in *Instance) corefileCommand(p Ports) (*exec.Cmd, error) {
	corefile := in.cfg.Corefile
	if !strings.Contains(corefile, PortPlaceholder) {
		return nil, fmt.Errorf("the Corefile has no %s where the DNS port goes:\n%s", PortPlaceholder, corefile)
	}
	for placeholder, port := range map[string]*int{PortPlaceholder: &in.DNS, MetricsPlaceholder: &in.Metrics, HealthPlaceholder: &in.Health, ReadyPlaceholder: &in.Ready} {
		if !strings.Contains(corefile, placeholder) {
			*port = 0
			continue
		}
		corefile = strings.ReplaceAll(corefile, placeholder, strconv.Itoa(*port))
	}
	conf := filepath.Join(in.cfg.Dir, "Corefile")
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.Command(in.cfg.Binary, "-conf", conf)
	cmd.Dir = in.cfg.Dir
	return cmd, nil
}

// Launch starts an instance (see StartProcess) and waits until it is
// ready, ctx is done or it exits; one that exits because another process
// took a port first is started again on fresh ports. An instance that does
// not become ready is stopped.
func Launch(ctx context.Context, cfg Config) (*Instance, error) {
	in, err := launch(ctx, cfg, func() (*Instance, error) { return StartProcess(cfg) })
	if err != nil && in != nil {
		_ = in.Stop()
	}
	return in, err
}

// launch starts instances with start until one is ready, or returns the
// last with the error of its wait.
func launch(ctx context.Context, cfg Config, start func() (*Instance, error)) (*Instance, error) {
	for try := 1; ; try++ {
		in, err := start()
		if err != nil {
			return nil, err
		}
		err = in.wait(ctx, cfg.ReadyTimeout, func() error { return cfg.Ready(in) })
		if err == nil {
			return in, nil
		}
		if errors.Is(err, ErrExited) && in.out.taken() && cfg.DNSPort == 0 && try < starts {
			continue
		}
		return in, err
	}
}

// Wait polls cond until it returns nil, failing after timeout or as soon as
// the instance exits (ErrExited).
func (in *Instance) Wait(timeout time.Duration, cond func() error) error {
	return in.wait(context.Background(), timeout, cond)
}

func (in *Instance) wait(ctx context.Context, timeout time.Duration, cond func() error) error {
	poll := in.cfg.Poll
	if poll == 0 {
		poll = pollInterval
	}
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if in.p.Exited() {
			return fmt.Errorf("%w (%s): %v", ErrExited, in.p.State(), err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
		case <-in.p.Done():
		case <-time.After(poll):
		}
	}
}

// SOA returns a Ready condition: the instance answers the SOA of zone over
// UDP, each query bounded by timeout.
func SOA(zone string, timeout time.Duration) func(*Instance) error {
	return func(in *Instance) error {
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(zone), dns.TypeSOA)
		c := &dns.Client{Net: "udp", Timeout: timeout}
		r, _, err := c.Exchange(m, in.Addr())
		if err != nil {
			return err
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) == 0 {
			return fmt.Errorf("SOA %s: %s with %d answers", zone, dns.RcodeToString[r.Rcode], len(r.Answer))
		}
		if _, ok := r.Answer[0].(*dns.SOA); !ok {
			return fmt.Errorf("SOA %s: answer %v", zone, r.Answer[0])
		}
		return nil
	}
}

// String returns the instance's name (Config.Name).
func (in *Instance) String() string {
	if in.cfg.Name != "" {
		return in.cfg.Name
	}
	return "coredns on " + in.Addr()
}

// Addr returns the instance's DNS address (UDP, and TCP on the same port).
func (in *Instance) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(in.DNS)) }

// MetricsURL returns the URL of the instance's prometheus metrics, "" when
// it has no metrics port.
func (in *Instance) MetricsURL() string {
	if in.Metrics == 0 {
		return ""
	}
	return "http://127.0.0.1:" + strconv.Itoa(in.Metrics) + "/metrics"
}

// metricsClient bounds a read of the metrics.
var metricsClient = &http.Client{Timeout: 2 * time.Second}

// ReadMetrics returns the instance's metrics, as the prometheus plugin
// exposes them.
func (in *Instance) ReadMetrics() (string, error) {
	resp, err := metricsClient.Get(in.MetricsURL())
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", errors.New(resp.Status)
	}
	var b bytes.Buffer
	_, err = b.ReadFrom(resp.Body)
	return b.String(), err
}

// Metric returns the value of the instance's series whose line starts with
// prefix (its name and labels), and whether there is one.
func (in *Instance) Metric(prefix string) (string, bool, error) {
	body, err := in.ReadMetrics()
	if err != nil {
		return "", false, err
	}
	sc := bufio.NewScanner(strings.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			return strings.TrimSpace(rest[strings.LastIndexByte(rest, ' ')+1:]), true, nil
		}
	}
	return "", false, sc.Err()
}

// Log returns what the instance has written to stdout and stderr so far;
// "" when Config.Output has it.
func (in *Instance) Log() string {
	if in.log == nil {
		return ""
	}
	return in.log.String()
}

// StampedLog is Log with each line after the time it was written
// (CoreDNS does not stamp its lines), a last line not ended yet as it is:
// what a failed test shows, so that an instance's lines can be read beside
// the test's own timeline.
func (in *Instance) StampedLog() string {
	if in.stamped == nil {
		return ""
	}
	plain := in.log.String()
	return in.stamped.String() + plain[strings.LastIndexByte(plain, '\n')+1:]
}

// Pid returns the instance's process id.
func (in *Instance) Pid() int { return in.p.Pid() }

// Done is closed once the instance has exited.
func (in *Instance) Done() <-chan struct{} { return in.p.Done() }

// Exited reports whether the instance has exited.
func (in *Instance) Exited() bool { return in.p.Exited() }

// State describes how the instance ended; "running" before it has.
func (in *Instance) State() string { return in.p.State() }

// Kill ends the instance with SIGKILL, as a crash, and waits until it is gone.
func (in *Instance) Kill() { in.p.Kill() }

// Stop thaws the instance and sends SIGTERM, and waits up to
// Config.StopTimeout for it to exit; one still there is killed and Stop
// returns an error.
func (in *Instance) Stop() error {
	grace := in.cfg.StopTimeout
	if grace == 0 {
		grace = StopTimeout
	}
	in.awaitStarted()
	return in.p.Stop(grace)
}

// startedBanner is what CoreDNS prints once caddy.Start has returned.
const startedBanner = "CoreDNS-"

// startWait bounds awaitStarted.
const startWait = 5 * time.Second

// awaitStarted waits, at most startWait, until the instance has printed
// its start-up banner or exited. caddy (v1.1.4) reads its list of servers
// on SIGTERM without the lock its start writes it under, and a server
// answers before that list is complete: a SIGTERM sent as soon as the
// first answer came is a data race in a -race build (seen in a loaded CI
// run). The banner comes once the list is written.
func (in *Instance) awaitStarted() {
	deadline := time.Now().Add(startWait)
	for !in.p.Exited() && time.Now().Before(deadline) && !strings.Contains(in.Log(), startedBanner) {
		select {
		case <-in.p.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Freeze stops the instance with SIGSTOP and returns once it is stopped: it
// answers nothing, renews nothing.
func (in *Instance) Freeze() error { return in.p.Freeze() }

// Thaw resumes a frozen instance with SIGCONT.
func (in *Instance) Thaw() error { return in.p.Thaw() }

// watch passes an instance's output on to w and notes whether it said that
// a port was taken, across writes.
type watch struct {
	w io.Writer

	mu    sync.Mutex
	tail  []byte // the end of the last write, which may hold a part of portTaken
	found bool
}

func (w *watch) Write(b []byte) (int, error) {
	w.mu.Lock()
	seen := append(w.tail, b...)
	w.found = w.found || bytes.Contains(seen, portTaken)
	w.tail = append([]byte(nil), seen[max(0, len(seen)-len(portTaken)+1):]...)
	w.mu.Unlock()
	return w.w.Write(b)
}

// taken reports whether the instance said that a port it was to listen on
// was taken.
func (w *watch) taken() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.found
}
