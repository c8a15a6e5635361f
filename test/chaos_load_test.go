package test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// chaosQPS is the rate dnsperf sends at, to each instance it loads.
const chaosQPS = 250

// chaosQueries are the queries dnsperf cycles through: cluster, role,
// node, SRV, TXT, SOA and names that do not exist.
var chaosQueries = []string{
	"local A", "primary.pgc A", "standby.pgc A", "pgc A", "n0.local A",
	"n1.local TXT", "_postgresql._tcp.local SRV", "p1.pgc A", "nope.local A", "nope A",
}

// dnsperfRun is one dnsperf process loading one instance.
type dnsperfRun struct {
	addr string
	p    *proc.Process
	out  *proc.Buffer
}

// startDnsperf loads the instance at addr with chaosQPS queries a second
// of queries ("name type", the name under Zone), each a timeout after 1 s,
// until stop is called.
func startDnsperf(t *testing.T, bin, addr string, queries []string) *dnsperfRun {
	t.Helper()
	file := filepath.Join(t.TempDir(), "queries")
	var q string
	for _, l := range queries {
		name, typ, _ := strings.Cut(l, " ")
		q += name + "." + Zone + " " + typ + "\n"
	}
	if err := os.WriteFile(file, []byte(q), 0o644); err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	// -l only bounds a run whose test died; stop ends it.
	cmd := exec.Command(bin, "-s", host, "-p", port, "-d", file, "-l", "3600",
		"-Q", strconv.Itoa(chaosQPS), "-c", "2", "-q", "32", "-t", "1")
	d := &dnsperfRun{addr: addr, out: &proc.Buffer{}}
	cmd.Stdout, cmd.Stderr = d.out, d.out
	if d.p, err = proc.Start(cmd); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.p.Kill() })
	return d
}

// dnsperfReport is what dnsperf counted.
type dnsperfReport struct {
	sent, completed, lost, interrupted int
	servfail, other                    int // responses other than NOERROR and NXDOMAIN
	codes                              string
	maxLatency                         string
}

// stop interrupts dnsperf (SIGINT: it stops sending and prints its
// statistics) and reads its report.
func (d *dnsperfRun) stop(t *testing.T) dnsperfReport {
	t.Helper()
	if err := syscall.Kill(d.p.Pid(), syscall.SIGINT); err != nil {
		t.Fatalf("interrupt dnsperf: %v", err)
	}
	select {
	case <-d.p.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("dnsperf did not stop within 10s of SIGINT:\n%s", d.out.String())
	}
	out := d.out.String()
	// A count that is zero may be left out (Queries interrupted).
	num := func(label string) int {
		m := regexp.MustCompile(label + `:\s+(\d+)`).FindStringSubmatch(out)
		if m == nil && label != "Queries interrupted" {
			t.Fatalf("dnsperf's report has no %q:\n%s", label, out)
		}
		if m == nil {
			return 0
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	r := dnsperfReport{
		sent: num("Queries sent"), completed: num("Queries completed"),
		lost: num("Queries lost"), interrupted: num("Queries interrupted"),
	}
	if m := regexp.MustCompile(`Response codes:\s+(.*)`).FindStringSubmatch(out); m != nil {
		r.codes = m[1]
	}
	for _, m := range regexp.MustCompile(`([A-Z]+) (\d+) \(`).FindAllStringSubmatch(r.codes, -1) {
		n, _ := strconv.Atoi(m[2])
		switch m[1] {
		case "NOERROR", "NXDOMAIN":
		case "SERVFAIL":
			r.servfail += n
		default:
			r.other += n
		}
	}
	if m := regexp.MustCompile(`Average Latency \(s\):.*max ([0-9.]+)\)`).FindStringSubmatch(out); m != nil {
		r.maxLatency = m[1] + "s"
	}
	return r
}

func (r dnsperfReport) String() string {
	return fmt.Sprintf("sent %d, completed %d, lost (timed out) %d, interrupted at the end %d; %s; max latency %s",
		r.sent, r.completed, r.lost, r.interrupted, r.codes, r.maxLatency)
}
