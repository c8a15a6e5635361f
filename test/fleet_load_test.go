package test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// dnsperfPath is the dnsperf the setup script installs.
const dnsperfPath = "dnsperf"

// Under dnsperf load on one instance of a fleet of three (built with -race
// under make test), backends flip and Redis is stopped and restarted: every
// query is answered NOERROR or NXDOMAIN, none SERVFAIL or lost, and no
// instance reports a data race.
func TestFleetUnderLoad(t *testing.T) {
	bin, err := exec.LookPath(dnsperfPath)
	if err != nil {
		t.Fatalf("dnsperf is missing (the setup script installs it: apt-get install -y dnsperf): %v", err)
	}
	const interval, timeout = 200 * time.Millisecond, 100 * time.Millisecond
	rs := redistest.Start(t)
	f := newFleet(t, fleetOptions{interval: interval, timeout: timeout, backends: 4})
	corefile := f.corefile(rs.URL())
	ins := startInstances(t, corefile, 3)
	Eventually(t, 20*time.Second, coordinated(t, ins, len(f.backends)))

	queries := filepath.Join(t.TempDir(), "queries")
	var q string
	for _, name := range []string{"local", "primary.local", "standby.local", "n0.local", "n1.local", "_postgresql._tcp.local", "nope"} {
		for _, typ := range []string{"A", "AAAA", "TXT", "SRV", "SOA"} {
			q += name + "." + Zone + " " + typ + "\n"
		}
	}
	if err := os.WriteFile(queries, []byte(q), 0o644); err != nil {
		t.Fatal(err)
	}
	host, port := "127.0.0.1", ins[0].Addr()[len("127.0.0.1:"):]
	const seconds = 8
	cmd := exec.Command(bin, "-s", host, "-p", port, "-d", queries, "-l", strconv.Itoa(seconds), "-c", "8", "-q", "64", "-t", "1")
	out := make(chan []byte, 1)
	go func() {
		b, err := cmd.CombinedOutput()
		if err != nil {
			b = append(b, []byte(fmt.Sprintf("\n(dnsperf: %v)", err))...)
		}
		out <- b
	}()
	// Meanwhile: flips, Redis away and back.
	f.backends[0].Close()
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts(0)))
	rs.Stop()
	f.backends[0].Open(t)
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts()))
	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	f.backends[1].Close()
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts(1)))
	report := string(<-out)
	t.Logf("dnsperf against %s for %ds:\n%s", ins[0].Addr(), seconds, report)
	completed := regexp.MustCompile(`Queries completed:\s+(\d+)`).FindStringSubmatch(report)
	lost := regexp.MustCompile(`Queries lost:\s+(\d+)`).FindStringSubmatch(report)
	codes := regexp.MustCompile(`Response codes:\s+(.*)`).FindStringSubmatch(report)
	if completed == nil || lost == nil || codes == nil {
		t.Fatalf("cannot read dnsperf's report")
	}
	if n, _ := strconv.Atoi(completed[1]); n < 1000 {
		t.Errorf("only %d queries completed", n)
	}
	if lost[1] != "0" {
		t.Errorf("%s queries lost", lost[1])
	}
	if regexp.MustCompile(`SERVFAIL|REFUSED|FORMERR`).MatchString(codes[1]) {
		t.Errorf("response codes under load: %s", codes[1])
	}
}
