package test

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/proc"
)

// backend is a node for check tcp (coretest.Backend), by its host:port.
type backend struct {
	*coretest.Backend
	addr string // host:port
}

func openBackend(t *testing.T, host string) *backend {
	t.Helper()
	b := coretest.NewBackend(t, host)
	return &backend{Backend: b, addr: b.Addr()}
}

func (b *backend) host() string { h, _, _ := net.SplitHostPort(b.addr); return h }
func (b *backend) port() string { _, p, _ := net.SplitHostPort(b.addr); return p }

// registerBackends puts backends in cluster "local", the first as primary.
func registerBackends(t *testing.T, reg *pgtest.Postgres, bs ...*backend) {
	t.Helper()
	var rows []string
	for i, b := range bs {
		role := "standby"
		if i == 0 {
			role = "primary"
		}
		rows = append(rows, fmt.Sprintf("('local', 'n%d', '%s', %s, '%s')", i+1, b.host(), b.port(), role))
	}
	reg.MustExec(t, "INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES "+strings.Join(rows, ", "))
}

// A TCP backend that stops accepting leaves every answer within
// fall×interval+timeout and comes back within rise×interval: measured over
// 20 flips.
func TestCheckTCPFlips(t *testing.T) {
	reg := Registry(t)
	a, b := openBackend(t, "127.0.0.21"), openBackend(t, "127.0.0.22")
	registerBackends(t, reg, a, b)
	const interval, timeout, rise, fall = 100 * time.Millisecond, 50 * time.Millisecond, 2, 2
	s := StartCoreDNS(t, Corefile(reg.DSN(""), "allow_loopback", "check tcp",
		fmt.Sprintf("interval %s", interval), fmt.Sprintf("timeout %s", timeout), fmt.Sprintf("rise %d", rise), fmt.Sprintf("fall %d", fall)))
	both := []string{"127.0.0.21", "127.0.0.22"}
	Eventually(t, 10*time.Second, func() error { return hasAddr(s, "local."+Zone, both...) })
	waitFor := func(want []string) time.Duration {
		start := time.Now()
		Eventually(t, 10*time.Second, func() error { return hasAddr(s, "local."+Zone, want...) })
		return time.Since(start)
	}
	var outs, ins []time.Duration
	for range 20 {
		b.Close()
		outs = append(outs, waitFor(both[:1]))
		b.Open(t)
		ins = append(ins, waitFor(both))
	}
	outBudget, inBudget := fall*interval+timeout, rise*interval
	t.Logf("out: p50 %v p99 %v (budget fall×interval+timeout = %v); in: p50 %v p99 %v (budget rise×interval = %v)",
		percentile(outs, 50), percentile(outs, 99), outBudget, percentile(ins, 50), percentile(ins, 99), inBudget)
	// Generous: a loaded 2-core machine running the race detector.
	if p := percentile(outs, 50); p > outBudget+interval+time.Second {
		t.Errorf("a refusing backend left the answer after %v (p50), budget %v", p, outBudget)
	}
	if p := percentile(ins, 50); p > inBudget+interval+time.Second {
		t.Errorf("a backend came back after %v (p50), budget %v", p, inBudget)
	}
	txt := MustQuery(t, "udp", s.UDP, "n2.local."+Zone, dns.TypeTXT)
	if len(txt.Answer) != 1 || !strings.Contains(txt.Answer[0].String(), `"check=tcp up"`) {
		t.Errorf("TXT: %v", txt.Answer)
	}
}

// All backends down: all_down open answers them anyway and counts each
// such answer; all_down closed answers NODATA with the SOA. The checks'
// metrics say so.
func TestCheckAllDown(t *testing.T) {
	reg := Registry(t)
	a, b := openBackend(t, "127.0.0.24"), openBackend(t, "127.0.0.25")
	registerBackends(t, reg, a, b)
	metricsPort, _ := proc.FreePort()
	opts := []string{"allow_loopback", "check tcp", "interval 100ms", "timeout 50ms"}
	corefile := func(extra ...string) string {
		return fmt.Sprintf("%s:0 {\n bind 127.0.0.1\n prometheus 127.0.0.1:%d\n pgcluster {\n  postgres %s\n  %s\n }\n}\n",
			Zone, metricsPort, reg.DSN(""), strings.Join(append(opts, extra...), "\n  "))
	}
	s := StartCoreDNS(t, corefile())
	Eventually(t, 10*time.Second, func() error {
		body, err := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
		if err != nil || !strings.Contains(body, `coredns_pgcluster_check_targets{state="up",zone="pgcluster.lan."} 2`) {
			return fmt.Errorf("both targets not up yet (%v)", err)
		}
		return nil
	})
	a.Close()
	b.Close()
	Eventually(t, 10*time.Second, func() error {
		body, err := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
		if err != nil || !strings.Contains(body, `coredns_pgcluster_check_targets{state="down",zone="pgcluster.lan."} 2`) {
			return fmt.Errorf("both targets not down yet (%v)", err)
		}
		return nil
	})
	if err := hasAddr(s, "local."+Zone, "127.0.0.24", "127.0.0.25"); err != nil {
		t.Fatalf("all_down open: %v", err)
	}
	// The primary first stays held (primary_hold: fall x interval +
	// timeout, 250 ms here), then all_down open answers it, and says so.
	wantTXT(t, s, "primary.local."+Zone, `"state=fail_open" "node=n1"`)
	if err := hasAddr(s, "primary.local."+Zone, "127.0.0.24"); err != nil {
		t.Fatalf("all_down open: %v", err)
	}
	body, err := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`coredns_pgcluster_fail_open_answers_total{zone="pgcluster.lan."}`,
		`coredns_pgcluster_probes_total{check="tcp",result="refused",zone="pgcluster.lan."}`,
		`coredns_pgcluster_probes_total{check="tcp",result="ok",zone="pgcluster.lan."}`,
		`coredns_pgcluster_probe_duration_seconds_count{check="tcp",zone="pgcluster.lan."}`,
		`coredns_pgcluster_split_brain_clusters{zone="pgcluster.lan."} 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if n, _ := metricValue(body, `coredns_pgcluster_fail_open_answers_total{zone="pgcluster.lan."}`); n < 2 {
		t.Errorf("fail-open answers counted: %v, want at least 2", n)
	}
	txt := MustQuery(t, "udp", s.UDP, "n1.local."+Zone, dns.TypeTXT)
	if len(txt.Answer) != 1 || !strings.Contains(txt.Answer[0].String(), `"reason=check_refused"`) {
		t.Errorf("TXT: %v", txt.Answer)
	}

	if err := s.Restart(corefile("all_down closed")); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 10*time.Second, func() error {
		r, err := Exchange("udp", s.UDP, "local."+Zone, dns.TypeA)
		if err != nil || len(r.Answer) != 0 || r.Rcode != dns.RcodeSuccess || len(r.Ns) != 1 || r.Ns[0].Header().Rrtype != dns.TypeSOA {
			return fmt.Errorf("all_down closed: %v %v, want NODATA with the SOA", r, err)
		}
		return nil
	})
}

// metricValue returns the value of the sample name (metric and labels, as
// exposed) in a /metrics body, and whether there is one that parses.
func metricValue(body, name string) (float64, bool) {
	for l := range strings.SplitSeq(body, "\n") {
		if rest, ok := strings.CutPrefix(l, name+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// countingBackend accepts and counts connections.
type countingBackend struct {
	*coretest.Backend
	addr string
}

func openCounting(t *testing.T, host string) *countingBackend {
	t.Helper()
	b := coretest.NewBackend(t, host)
	return &countingBackend{Backend: b, addr: b.Addr()}
}

// A Corefile reload that turns checks off, and a shutdown, stop every probe:
// no connection reaches a backend afterwards.
func TestCheckStopsOnReloadAndShutdown(t *testing.T) {
	reg := Registry(t)
	b := openCounting(t, "127.0.0.26")
	host, port, _ := net.SplitHostPort(b.addr)
	reg.MustExec(t, fmt.Sprintf("INSERT INTO pgcluster_nodes(cluster, name, address, port) VALUES ('local', 'n1', '%s', %s)", host, port))
	checks := Corefile(reg.DSN(""), "allow_loopback", "check tcp", "interval 100ms", "timeout 50ms")
	s := StartCoreDNS(t, checks)
	quiet := func(what string) {
		t.Helper()
		// Probes every 100 ms: three intervals without a connection mean
		// they stopped. Wait for one such window, with a deadline.
		Eventually(t, 5*time.Second, func() error {
			before := b.Accepts()
			time.Sleep(300 * time.Millisecond)
			if n := b.Accepts() - before; n != 0 {
				return fmt.Errorf("%s: %d probes in 300 ms", what, n)
			}
			return nil
		})
	}
	Eventually(t, 5*time.Second, func() error {
		if b.Accepts() < 3 {
			return fmt.Errorf("%d probes so far", b.Accepts())
		}
		return nil
	})
	if err := s.Restart(Corefile(reg.DSN(""), "allow_loopback")); err != nil {
		t.Fatal(err)
	}
	quiet("after a reload without check")
	if err := s.Restart(checks); err != nil {
		t.Fatal(err)
	}
	start := b.Accepts()
	Eventually(t, 5*time.Second, func() error {
		if b.Accepts()-start < 3 {
			return fmt.Errorf("checks not back after a reload with check")
		}
		return nil
	})
	s.Stop()
	quiet("after shutdown")
}
