package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/proc"
)

// Time limits of the tests that run the demo as make run does.
const (
	// upTimeout bounds a demo's start: three PostgreSQL servers made by
	// initdb and pg_basebackup, Redis and three instances, on a loaded
	// 2-core machine (about 25 s alone).
	upTimeout = 3 * time.Minute
	// exitTimeout bounds a demo's shutdown once told to stop: the fleet's
	// stopTimeout, then pg_ctl stop of four servers.
	exitTimeout = time.Minute
)

// build is cmd/coredns as make build builds it and the demo as make run
// does, built once per test process by one go build, linking them at once:
// a build whose packages are cached is mostly the links.
var build = coretest.Build{Packages: []string{coretest.CoreDNS, "github.com/pgcluster/pgcluster/internal/cmd/demo", "github.com/pgcluster/pgcluster/cmd/pgclusterctl"}}

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	build.Remove()
	os.Exit(code)
}

// binaries returns the paths of the built coredns and demo.
func binaries(t *testing.T) (coredns, demo string) {
	t.Helper()
	return build.Path(t, "coredns"), build.Path(t, "demo")
}

// demoRun is the demo running as its own process, its standard output and
// error one pipe (make run 2>&1 | tee) read by the test.
type demoRun struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	out    *proc.Buffer
	r      *os.File      // the read end of its output: closing it is what tee's end does
	exited chan struct{} // closed once it has exited
	eof    chan struct{} // closed once its output is read to the end, or closed
	tmp    string        // its directory, once up
	began  time.Time     // when it was started
}

// startDemo starts the demo binary with args, its TMPDIR tmpdir ("": the
// test's), and stops it at the end of the test if it still runs.
func startDemo(t *testing.T, name, tmpdir string, args ...string) *demoRun {
	t.Helper()
	coredns, demo := binaries(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	d := &demoRun{t: t, name: name, out: &proc.Buffer{}, r: r, exited: make(chan struct{}), eof: make(chan struct{})}
	d.cmd = exec.Command(demo, append([]string{"-coredns", coredns}, args...)...)
	d.cmd.Stdout, d.cmd.Stderr = w, w
	if tmpdir != "" {
		d.cmd.Env = append(os.Environ(), "TMPDIR="+tmpdir)
	}
	// Should the test die, the demo is told to stop as by Ctrl-C, and
	// stops what it started.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	d.began = time.Now()
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	go func() {
		io.Copy(d.out, r)
		close(d.eof)
	}()
	go func() {
		d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() {
		if !d.hasExited() {
			d.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-d.exited:
			case <-time.After(exitTimeout):
				d.cmd.Process.Kill()
				<-d.exited
			}
		}
		r.Close()
		if t.Failed() {
			t.Logf("the output of %s:\n%s", d.name, d.out)
		}
	})
	return d
}

func (d *demoRun) hasExited() bool {
	select {
	case <-d.exited:
		return true
	default:
		return false
	}
}

// waitOutput waits until the demo's output holds s, failing the test if it
// exits first or upTimeout passes.
func (d *demoRun) waitOutput(s string) {
	d.t.Helper()
	deadline := time.After(upTimeout)
	for !strings.Contains(d.out.String(), s) {
		select {
		case <-d.exited:
			if strings.Contains(d.out.String(), s) {
				return
			}
			d.t.Fatalf("%s exited (%s) before printing %q", d.name, d.cmd.ProcessState, s)
		case <-deadline:
			d.t.Fatalf("%s has not printed %q after %v", d.name, s, upTimeout)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// closingLine is the demo's last line of instructions: once printed, it
// is up and waits for Ctrl-C.
var closingLine = regexp.MustCompile(`Ctrl-C stops the fleet, Redis and PostgreSQL and removes (\S+)\.\n`)

// waitUp waits until the demo has printed its instructions, and notes its
// directory.
func (d *demoRun) waitUp() {
	d.t.Helper()
	d.waitOutput("pgcluster demo is up")
	d.t.Logf("%s is up %v after it started", d.name, time.Since(d.began).Round(time.Millisecond))
	d.waitOutput("Ctrl-C stops the fleet")
	m := closingLine.FindStringSubmatch(d.out.String())
	if m == nil {
		d.t.Fatalf("%s: no directory in its closing line", d.name)
	}
	d.tmp = m[1]
}

// waitExit waits up to exitTimeout for the demo to exit and returns its
// exit code.
func (d *demoRun) waitExit() int {
	d.t.Helper()
	select {
	case <-d.exited:
		return d.cmd.ProcessState.ExitCode()
	case <-time.After(exitTimeout):
		d.t.Fatalf("%s still runs %v after it was told to stop", d.name, exitTimeout)
		return 0
	}
}

func (d *demoRun) signal(sig syscall.Signal) {
	d.t.Helper()
	if err := d.cmd.Process.Signal(sig); err != nil {
		d.t.Fatalf("send %v to %s: %v", sig, d.name, err)
	}
}

// demoPids matches the pids an up demo prints for its instances and Redis.
var demoPids = regexp.MustCompile(`(?m)^  (coredns-\d) \S+  pid (\d+) |\((redis-server) pid (\d+)\)`)

// started returns what the up demo runs, by pid: the instances and Redis,
// as it prints them, and every process whose command line names its
// directory (its PostgreSQL servers, started detached by pg_ctl, and the
// instances again). It fails the test unless that is the fleet, Redis and
// four PostgreSQL servers (the registry and three nodes).
func (d *demoRun) started() map[int]string {
	d.t.Helper()
	pids := map[int]string{}
	for _, m := range demoPids.FindAllStringSubmatch(d.out.String(), -1) {
		name, pid := m[1]+m[3], m[2]+m[4]
		n, _ := strconv.Atoi(pid)
		pids[n] = name
	}
	postgres := 0
	naming := processesNaming(d.tmp)
	for pid, cmdline := range naming {
		// A backend that a postmaster has just forked bears its command
		// line until it sets its own title.
		_, ppid := stat(pid)
		if _, ok := naming[ppid]; ok {
			continue
		}
		if _, ok := pids[pid]; ok {
			continue
		}
		pids[pid] = cmdline
		if strings.Contains(cmdline, "postgres -D ") {
			postgres++
		}
	}
	if len(pids) != fleetSize+1+postgres || postgres != 1+len(demoNodes) {
		d.t.Fatalf("%s runs %v; want %d instances, Redis and %d PostgreSQL servers", d.name, pids, fleetSize, 1+len(demoNodes))
	}
	return pids
}

// processesNaming returns the live processes whose command line holds dir/,
// by pid.
func processesNaming(dir string) map[int]string {
	found := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(b, []byte(dir+"/")) || !running(pid) {
			continue
		}
		found[pid] = string(bytes.TrimSpace(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
	}
	return found
}

// running reports whether pid is a process that has not exited: a zombie
// waiting for its parent to reap it has.
func running(pid int) bool {
	state, _ := stat(pid)
	return state != 0 && state != 'Z'
}

// stat returns the state and the parent of a process from /proc/PID/stat,
// state 0 when there is no such process.
func stat(pid int) (state byte, ppid int) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0
	}
	// "pid (comm) S ppid ...": comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, 0
	}
	ppid, _ = strconv.Atoi(f[1])
	return f[0][0], ppid
}

// checkNothingLeft fails the test if a process the demo had started still
// runs, or its directory is still there.
func (d *demoRun) checkNothingLeft(pids map[int]string) {
	d.t.Helper()
	for pid, name := range pids {
		if running(pid) {
			d.t.Errorf("%s has exited but %s (pid %d) still runs", d.name, name, pid)
		}
	}
	for pid, cmdline := range processesNaming(d.tmp) {
		d.t.Errorf("%s has exited but pid %d still runs: %s", d.name, pid, cmdline)
	}
	if _, err := os.Stat(d.tmp); !errors.Is(err, os.ErrNotExist) {
		d.t.Errorf("%s has exited but its directory %s is still there (%v)", d.name, d.tmp, err)
	}
}

// TestDemoStopsAsOnCtrlC runs the demo as make run does and ends it each
// way a terminal session ends it besides Ctrl-C: its output piped to a
// reader that is gone (make run 2>&1 | tee log, and Ctrl-C ends tee too),
// SIGPIPE, the terminal closed (SIGHUP), SIGTERM. Each time it must stop
// everything it started, as on Ctrl-C: its PostgreSQL servers run detached
// (pg_ctl) and outlive a demo that dies instead.
//
// The cases run one after the other. In parallel (t.Parallel, two at a
// time on a 2-core machine) each demo's start, bound by the CPU (initdb,
// pg_basebackup, the servers' start), took about twice as long, and the
// test as a whole was no faster: 36/175/41 s against 30/82/37 s one after
// the other, three runs each with -race on the loaded machine.
func TestDemoStopsAsOnCtrlC(t *testing.T) {
	for _, c := range []struct {
		name string
		// read: the test reads the demo's output to the end, so the
		// demo's last words can be checked.
		read bool
		stop func(d *demoRun)
	}{
		{"interrupted, its output pipe's reader gone", false, func(d *demoRun) {
			d.r.Close()
			d.signal(syscall.SIGINT)
		}},
		{"output to a closed pipe", false, func(d *demoRun) {
			d.r.Close()
			// SIGUSR1 with Redis running makes the demo write a line.
			d.signal(syscall.SIGUSR1)
		}},
		{"SIGPIPE", true, func(d *demoRun) { d.signal(syscall.SIGPIPE) }},
		{"SIGHUP", true, func(d *demoRun) { d.signal(syscall.SIGHUP) }},
		{"SIGTERM", true, func(d *demoRun) { d.signal(syscall.SIGTERM) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := startDemo(t, "the demo", "")
			d.waitUp()
			pids := d.started()
			began := time.Now()
			c.stop(d)
			if code := d.waitExit(); code != 0 {
				t.Errorf("the demo exited with status %d, want 0 as on Ctrl-C", code)
			}
			t.Logf("%s: stopped %d processes and removed its directory in %v", c.name, len(pids), time.Since(began).Round(time.Millisecond))
			d.checkNothingLeft(pids)
			if c.read && !strings.Contains(d.out.String(), "signal received: stopping the fleet, Redis and PostgreSQL, removing "+d.tmp) {
				t.Errorf("the demo did not say it was stopping everything, as on Ctrl-C")
			}
		})
	}
}

// TestTwoDemos runs two demos at once, as two make run in two terminals:
// the second runs on its own — its own node servers, checked by its own
// fleet, in its own registry — and the first answers as before, whatever
// happens to the second's nodes. A demo asked for a port that one of them
// holds refuses before it starts anything, in one line naming the port.
func TestTwoDemos(t *testing.T) {
	first := startDemo(t, "the first demo", "")
	first.waitUp()
	firstNodes := first.srvPorts()
	first.checkOwnNodes(firstNodes)

	second := startDemo(t, "the second demo", "")
	second.waitUp()
	secondNodes := second.srvPorts()
	second.checkOwnNodes(secondNodes)
	for name, addr := range secondNodes {
		if firstNodes[name] == addr {
			t.Errorf("both demos have %s at %s", name, addr)
		}
	}
	if got := first.srvPorts(); fmt.Sprint(got) != fmt.Sprint(firstNodes) {
		t.Errorf("with the second demo up, the first answers SRV %v; it answered %v before", got, firstNodes)
	}
	for _, d := range []*demoRun{first, second} {
		for _, server := range d.dnsServers() {
			waitFor(t, 15*time.Second, func() error { return answersPrimary(server, "127.0.0.11") })
		}
	}

	// The second's pg3 stopped: the second's fleet takes it out, the
	// first's, checking its own pg3, keeps it.
	stopLine := regexp.MustCompile(`(?m)^  (\S.*/pg_ctl -D \S+ -l \S+ stop -m fast)$`).FindStringSubmatch(second.out.String())
	if stopLine == nil || !strings.Contains(stopLine[1], "-D "+second.tmp+"/") {
		t.Fatalf("the second demo printed no pg_ctl line stopping its pg3: %q", stopLine)
	}
	if out, err := exec.Command("sh", "-c", stopLine[1]).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", stopLine[1], err, out)
	}
	for _, server := range second.dnsServers() {
		waitFor(t, 20*time.Second, func() error { return answersProd(server, []string{"127.0.0.11", "127.0.0.12"}) })
	}
	for _, server := range first.dnsServers() {
		if err := answersProd(server, []string{"127.0.0.11", "127.0.0.12", "127.0.0.13"}); err != nil {
			t.Errorf("the second demo's pg3 stopped, the first: %v", err)
		}
	}

	// Ports given on the command line that a running demo holds.
	dnsPort := strings.TrimPrefix(first.dnsServers()[0], "127.0.0.1:")
	registry := regexp.MustCompile(`registry  psql 'postgres://postgres@127\.0\.0\.1:(\d+)/`).FindStringSubmatch(first.out.String())
	if registry == nil {
		t.Fatal("the first demo printed no registry line")
	}
	for _, c := range []struct {
		args  []string
		taken string
	}{
		{[]string{"-port", dnsPort}, "DNS port " + dnsPort + " on 127.0.0.1 is taken"},
		{[]string{"-pgport", registry[1]}, "registry port " + registry[1] + " on 127.0.0.1 is taken"},
	} {
		tmpdir := t.TempDir()
		third := startDemo(t, "a demo with "+strings.Join(c.args, " "), tmpdir, c.args...)
		if code := third.waitExit(); code != 1 {
			t.Errorf("%s exited with status %d, want 1", third.name, code)
		}
		out := third.readAll()
		if strings.Count(out, "\n") != 1 || !strings.Contains(out, c.taken) {
			t.Errorf("%s printed %q; want one line saying %q", third.name, out, c.taken)
		}
		if entries, _ := os.ReadDir(tmpdir); len(entries) != 0 {
			t.Errorf("%s left %v in its TMPDIR: it started something before refusing", third.name, entries)
		}
	}
}

// readAll returns the output of an exited demo, read to its end: the pipe
// ends once the demo and every child holding it have exited.
func (d *demoRun) readAll() string {
	d.t.Helper()
	select {
	case <-d.eof:
	case <-time.After(exitTimeout):
		d.t.Errorf("%s: its output still open %v after it exited", d.name, exitTimeout)
	}
	return d.out.String()
}

// dnsServers returns the DNS addresses of the up demo's instances.
func (d *demoRun) dnsServers() []string {
	var servers []string
	for _, m := range regexp.MustCompile(`(?m)^  coredns-\d (\S+)  pid`).FindAllStringSubmatch(d.out.String(), -1) {
		servers = append(servers, m[1])
	}
	if len(servers) != fleetSize {
		d.t.Fatalf("%s printed %d instances, want %d", d.name, len(servers), fleetSize)
	}
	return servers
}

// srvPorts asks each instance of the demo for the SRV records of cluster
// local and returns the nodes' addresses by name, failing the test unless
// every instance gives the same three.
func (d *demoRun) srvPorts() map[string]string {
	d.t.Helper()
	var first map[string]string
	for _, server := range d.dnsServers() {
		var nodes map[string]string
		waitFor(d.t, 15*time.Second, func() error {
			var err error
			nodes, err = srvAddrs(server)
			if err == nil && len(nodes) != len(demoNodes) {
				err = fmt.Errorf("%s: SRV names %d nodes, want %d: %v", server, len(nodes), len(demoNodes), nodes)
			}
			return err
		})
		if first != nil && fmt.Sprint(nodes) != fmt.Sprint(first) {
			d.t.Fatalf("%s: instances answer SRV %v and %v", d.name, first, nodes)
		}
		first = nodes
	}
	return first
}

// checkOwnNodes fails the test unless nodes, as the demo's fleet answers
// them, are the nodes in the demo's own printed list, each served by a
// PostgreSQL server that the demo started (its command line names the
// demo's directory) on that port.
func (d *demoRun) checkOwnNodes(nodes map[string]string) {
	d.t.Helper()
	servers := map[string]bool{}
	for _, cmdline := range processesNaming(d.tmp) {
		if m := regexp.MustCompile(`postgres -D \S+ -p (\d+)`).FindStringSubmatch(cmdline); m != nil {
			servers[m[1]] = true
		}
	}
	for name, addr := range nodes {
		if !strings.Contains(d.out.String(), name+" "+addr) {
			d.t.Errorf("%s: its fleet answers %s at %s, which its output does not list", d.name, name, addr)
		}
		_, port, _ := strings.Cut(addr, ":")
		if !servers[port] {
			d.t.Errorf("%s: its fleet answers %s at %s, where no server of its own listens (its servers: %v)", d.name, name, addr, servers)
		}
	}
}

// srvAddrs asks server for the SRV records of cluster local and returns
// each node's address and port, by node name.
func srvAddrs(server string) (map[string]string, error) {
	r, err := exchange(server, "_postgresql._tcp.local."+zone, dns.TypeSRV)
	if err != nil {
		return nil, err
	}
	nodes := map[string]string{}
	for _, rr := range r.Answer {
		srv, ok := rr.(*dns.SRV)
		if !ok {
			continue
		}
		a, err := exchange(server, srv.Target, dns.TypeA)
		if err != nil {
			return nil, err
		}
		if len(a.Answer) != 1 {
			return nil, fmt.Errorf("%s: %s has %d records, want one A", server, srv.Target, len(a.Answer))
		}
		ip, ok := a.Answer[0].(*dns.A)
		if !ok {
			return nil, fmt.Errorf("%s: %s answers %v, want an A record", server, srv.Target, a.Answer[0])
		}
		name, _, _ := strings.Cut(srv.Target, ".")
		nodes[name] = net.JoinHostPort(ip.A.String(), strconv.Itoa(int(srv.Port)))
	}
	return nodes, nil
}

// answersPrimary checks that server answers primary.local.Z with one A
// record, want: a fleet checking servers of two demos sees two primaries
// and answers none.
func answersPrimary(server, want string) error {
	r, err := exchange(server, "primary.local."+zone, dns.TypeA)
	if err != nil {
		return err
	}
	if len(r.Answer) != 1 {
		return fmt.Errorf("%s: primary.local.%s answers %v, want one A %s", server, zone, r.Answer, want)
	}
	if a, ok := r.Answer[0].(*dns.A); !ok || a.A.String() != want {
		return fmt.Errorf("%s: primary.local.%s answers %v, want A %s", server, zone, r.Answer[0], want)
	}
	return nil
}

// exchange asks server one question and returns the answer when it is
// NOERROR.
func exchange(server, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Timeout: time.Second}
	r, _, err := c.Exchange(m, server)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", server, name, err)
	}
	if r.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("%s: %s: %s", server, name, dns.RcodeToString[r.Rcode])
	}
	return r, nil
}
