package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/proc"
)

// TestDemo starts the demo as make run does — the registry, a real
// PostgreSQL server per node, a real redis-server and three bin/coredns
// processes — and checks the fleet: each instance answers prod with its
// CNAME and addresses, every instance is coordinated and their leases add
// up to one per node; with Redis stopped each falls back to local checks,
// and with Redis started again they coordinate again. Once the demo is
// stopped, none of the processes it started is left, nor its directory.
func TestDemo(t *testing.T) {
	bin, _ := binaries(t)
	t.Setenv("TMPDIR", os.TempDir()) // start sets it; stop restores it
	// pgtest makes its initdb template once per process, in the TMPDIR of
	// the first start: here the shared one, not a demo's directory that
	// stop removes (the demo binary starts once per process; this test
	// may run more than once).
	pgtest.New(t)
	out := &proc.Buffer{}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	d, err := start(ctx, options{coredns: bin}, out)
	if err != nil {
		t.Fatalf("start the demo: %v\nits output:\n%s", err, out)
	}
	stopped := false
	defer func() {
		if !stopped {
			d.stop()
		}
		if t.Failed() {
			t.Logf("the demo's output:\n%s", out)
		}
	}()
	if err := seed(ctx, d.dsn, d.rows); err != nil { // seeding again is harmless
		t.Fatal(err)
	}

	if len(d.fleet) != 3 {
		t.Fatalf("the demo runs %d CoreDNS instances, want 3", len(d.fleet))
	}
	want := []string{"127.0.0.11", "127.0.0.12", "127.0.0.13"}
	if len(d.nodes) != len(demoNodes) {
		t.Fatalf("%d of %d nodes have a server", len(d.nodes), len(demoNodes))
	}
	for _, in := range d.fleet {
		waitFor(t, 15*time.Second, func() error { return answersProd(in.Addr(), want) })
	}

	if states, err := waitMode(ctx, d.fleet, modeCoordinated, len(demoNodes), 15*time.Second); err != nil {
		t.Fatalf("the fleet is not coordinated with one lease per node: %v (%s)", err, describe(states))
	}
	if d.settleErr != nil {
		t.Errorf("start said the fleet had not settled: %v", d.settleErr)
	}

	// The printed loop over the fleet's metrics names the instance of
	// each line.
	var text bytes.Buffer
	redisInstructions(&text, d, os.Getpid())
	loop := metricsLoop(d)
	if !strings.Contains(text.String(), "  "+loop+"\n") {
		t.Fatalf("the Redis instructions do not print the metrics loop %q:\n%s", loop, &text)
	}
	checkMetricsLoop(t, d, loop)
	checkDrainLines(t, d, want)
	checkZones(t, d)

	// Redis stopped: every instance checks locally, answering all the
	// while. Started again: coordinated again, one lease per node, and
	// the demo prints the new server's pid to freeze it with.
	oldPid := d.redis.Pid()
	d.redis.Stop()
	if states, err := waitMode(ctx, d.fleet, modeLocal, 0, 15*time.Second); err != nil {
		t.Fatalf("Redis stopped, the fleet is not in local mode: %v (%s)", err, describe(states))
	}
	for _, in := range d.fleet {
		if _, err := probe(in.Addr()); err != nil {
			t.Errorf("%s with Redis stopped: %v", in.name, err)
		}
	}
	d.redisBack()
	if states, err := waitMode(ctx, d.fleet, modeCoordinated, len(demoNodes), 15*time.Second); err != nil {
		t.Fatalf("Redis back, the fleet is not coordinated with one lease per node: %v (%s)", err, describe(states))
	}
	newPid := d.redis.Pid()
	if newPid == oldPid || newPid == 0 {
		t.Errorf("redis-server's pid is %d after the restart, %d before; want a new process", newPid, oldPid)
	}
	back := out.String()[strings.LastIndex(out.String(), "demo: redis-server is back on"):]
	if want := fmt.Sprintf("kill -STOP %d, thaw it with kill -CONT %d\n", newPid, newPid); !strings.Contains(back, want) {
		t.Errorf("after the restart the demo printed %q; want the new pid: %q", back, want)
	}

	pids := map[int]string{d.redis.Pid(): "redis-server"}
	for _, in := range d.fleet {
		pids[in.Pid()] = in.name
	}
	tmp := d.tmp
	stopped = true
	if err := d.stop(); err != nil {
		t.Errorf("stop the demo: %v", err)
	}
	for pid, name := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
			t.Errorf("%s (pid %d) is still there after the demo stopped: kill(0) = %v, %q", name, pid, err, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}))
		}
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the demo's directory %s is still there after it stopped: %v", tmp, err)
	}
	if got := os.Getenv("TMPDIR"); got != os.TempDir() {
		t.Errorf("TMPDIR is %q after the demo stopped, want it restored", got)
	}
}

// checkMetricsLoop runs the printed loop over the fleet's metrics and
// checks that it prints each instance's mode and leases, each line after
// the instance's name. It needs curl, as a person running it does.
func checkMetricsLoop(t *testing.T, d *demo, loop string) {
	t.Helper()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Logf("not running the metrics loop: %v", err)
		return
	}
	out, err := exec.Command("bash", "-c", loop).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", loop, err, out)
	}
	modes := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, metric, _ := strings.Cut(line, ": ")
		if !strings.HasPrefix(metric, "coredns_pgcluster_redis_") {
			t.Errorf("the metrics loop printed %q: not an instance's name and a metric", line)
		}
		if strings.HasPrefix(metric, "coredns_pgcluster_redis_mode{") {
			modes[name]++
		}
	}
	// An instance that never held a lease has no leases line.
	for _, in := range d.fleet {
		if modes[in.name] != 1 {
			t.Errorf("the metrics loop printed %d mode lines for %s, want one:\n%s", modes[in.name], in.name, out)
		}
	}
}

// answersProd checks that server answers prod.Z with the CNAME and, when
// want is set, exactly the addresses in want.
func answersProd(server string, want []string) error {
	r, err := probe(server)
	if err != nil {
		return err
	}
	var target string
	var addrs []string
	for _, rr := range r.Answer {
		switch rr := rr.(type) {
		case *dns.CNAME:
			target = rr.Target
		case *dns.A:
			addrs = append(addrs, rr.A.String())
		}
	}
	slices.Sort(addrs)
	if target != "local."+zone+"." || (want != nil && !slices.Equal(addrs, want)) {
		return errors.New(server + ": prod." + zone + " answers CNAME " + target + ", A " + strings.Join(addrs, " ") + "; want CNAME local." + zone + ". and A " + strings.Join(want, " "))
	}
	return nil
}

// waitFor polls cond until it returns nil, failing the test with its last
// error after timeout.
func waitFor(t *testing.T, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestCheckFree(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := checkFree(l.Addr().String(), false); err == nil {
		t.Errorf("checkFree(%s), a port in use, = nil; want an error", l.Addr())
	}
}

// checkDrainLines runs the printed drain and undrain lines (bin/pgclusterctl
// as built for the test): pg3 leaves prod on every instance, then comes
// back; the drains line lists the drain between them.
func checkDrainLines(t *testing.T, d *demo, all []string) {
	t.Helper()
	var text bytes.Buffer
	instructions(&text, d)
	lines := map[string]string{}
	for _, l := range strings.Split(text.String(), "\n") {
		l = strings.TrimSpace(l)
		for _, cmd := range []string{"drain", "drains", "undrain"} {
			if strings.HasPrefix(l, "bin/pgclusterctl "+cmd+" ") {
				lines[cmd] = strings.Replace(l, "bin/pgclusterctl", build.Path(t, "pgclusterctl"), 1)
			}
		}
	}
	if len(lines) != 3 {
		t.Fatalf("the instructions print %d of the drain, drains and undrain lines:\n%s", len(lines), &text)
	}
	runLine := func(cmd string) string {
		out, err := exec.Command("bash", "-c", lines[cmd]).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", lines[cmd], err, out)
		}
		return string(out)
	}
	runLine("drain")
	for _, in := range d.fleet {
		waitFor(t, 10*time.Second, func() error { return answersProd(in.Addr(), all[:2]) })
	}
	if out := runLine("drains"); !strings.Contains(out, "demo maintenance") || !strings.Contains(out, "pg3") {
		t.Errorf("the drains line printed no drain of pg3:\n%s", out)
	}
	runLine("undrain")
	for _, in := range d.fleet {
		waitFor(t, 10*time.Second, func() error { return answersProd(in.Addr(), all) })
	}
}

// checkZones asks every instance for prod as a client of each zone's
// network, as the printed dig +subnet lines do: zone a's client gets pg1
// first, zone b's pg2 and pg3 first (topology prefer), with the
// network's prefix as the reply's scope.
func checkZones(t *testing.T, d *demo) {
	t.Helper()
	first := map[string][]string{"a": {"127.0.0.11"}, "b": {"127.0.0.12", "127.0.0.13"}}
	for _, in := range d.fleet {
		for _, nw := range demoNetworks {
			subnet, z := zoneSubnet(nw[0]), nw[1]
			// Three answers in a row: the rotation of an unordered
			// set would put another node first in one of them.
			waitFor(t, 10*time.Second, func() error {
				for range 3 {
					if err := zoneFirst(in, subnet, z, first[z]); err != nil {
						return err
					}
				}
				return nil
			})
		}
	}
}

// zoneFirst asks in for prod with the ECS subnet, and checks that the
// three addresses come with first's first.
func zoneFirst(in *instance, subnet, z string, first []string) error {
	m := new(dns.Msg)
	m.SetQuestion("prod."+zone+".", dns.TypeA)
	p := netip.MustParsePrefix(subnet)
	o := &dns.OPT{Hdr: dns.RR_Header{Name: ".", Rrtype: dns.TypeOPT}}
	o.SetUDPSize(1232)
	o.Option = []dns.EDNS0{&dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IP(p.Addr().AsSlice())}}
	m.Extra = []dns.RR{o}
	r, err := dns.Exchange(m, in.Addr())
	if err != nil {
		return err
	}
	var addrs []string
	for _, rr := range r.Answer {
		if a, ok := rr.(*dns.A); ok {
			addrs = append(addrs, a.A.String())
		}
	}
	if len(addrs) != 3 || !slices.Equal(slices.Sorted(slices.Values(addrs[:len(first)])), first) {
		return fmt.Errorf("%s: prod from %s (zone %s) answers %v, want %v first", in.name, subnet, z, addrs, first)
	}
	return nil
}
