package health

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// BenchmarkProbeCost measures what tcp checks cost: 1,000 and 10,000 targets
// at interval 1s, for 20s each once all are Up (HEALTH_BENCH_DURATION
// overrides, e.g. 5s). The targets are listeners on 127.0.0.1-127.0.0.10, 250
// targets per listener, that accept and close; they run in a child process
// (this test binary, see TestMain), so that the figures are the checker's
// alone. It reports the checker's CPU in cores (getrusage, user+system), its
// resident set at the end and its peak (/proc/self/status VmRSS, VmHWM), the
// probes run per second, and the listeners' CPU apart. b.N is ignored: one run
// is one measurement. Goal: 10,000 targets under 0.5 core and 200 MB.
//
//	go test -run '^$' -bench ProbeCost ./health/
func BenchmarkProbeCost(b *testing.B) {
	duration := benchDuration(b)
	raiseFileLimit(b)
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("targets=%d", n), func(b *testing.B) { benchProbeCost(b, n, duration) })
	}
}

func benchProbeCost(b *testing.B, n int, duration time.Duration) {
	const perListener = 250
	lns := startListeners(b, (n+perListener-1)/perListener)
	var probes, failed atomic.Int64
	c, err := New(Config{Check: CheckTCP, Interval: time.Second, Timeout: time.Second,
		Observe: func(_, cause string, _ time.Duration) {
			probes.Add(1)
			if cause != CauseOK {
				failed.Add(1)
			}
		}})
	if err != nil {
		b.Fatal(err)
	}
	ts := make([]Target, n)
	for i := range ts {
		ts[i] = Target{Key: "c/n" + strconv.Itoa(i), Addr: lns.addrs[i%len(lns.addrs)]}
	}
	c.SetTargets(ts)
	ups := make(chan int, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx, func(v View) {
			up := 0
			for _, vd := range v.All() {
				if vd.State == Up {
					up++
				}
			}
			select {
			case <-ups:
			default:
			}
			ups <- up
		})
	}()
	defer func() { cancel(); <-done }()
	deadline := time.After(30 * time.Second)
	for up := 0; up < n; {
		select {
		case up = <-ups:
		case <-deadline:
			b.Fatalf("only %d of %d targets Up after 30s", up, n)
		}
	}

	b.ResetTimer()
	cpu0, lcpu0, wall0, probes0, failed0 := processCPU(), lns.cpu(b), time.Now(), probes.Load(), failed.Load()
	time.Sleep(duration) // the measurement window: the checker runs meanwhile
	cpu, lcpu, wall := processCPU()-cpu0, lns.cpu(b)-lcpu0, time.Since(wall0)
	b.StopTimer()
	np, nf := probes.Load()-probes0, failed.Load()-failed0
	rss, hwm := memStatus(b, "VmRSS"), memStatus(b, "VmHWM")
	cores, lcores := cpu.Seconds()/wall.Seconds(), lcpu.Seconds()/wall.Seconds()
	b.ReportMetric(cores, "cores")
	b.ReportMetric(rss, "MB-RSS")
	b.ReportMetric(hwm, "MB-peak")
	b.ReportMetric(float64(np)/wall.Seconds(), "probes/s")
	b.ReportMetric(lcores, "listener-cores")
	b.Logf("%d targets, interval 1s, %v: checker %.3f cores, RSS %.1f MB (peak %.1f MB), %d probes (%.0f/s), %d failed; listeners %.3f cores",
		n, wall.Round(time.Second), cores, rss, hwm, np, float64(np)/wall.Seconds(), nf, lcores)
	if nf > 0 {
		b.Errorf("%d of %d probes failed against listeners that accept", nf, np)
	}
}

// listeners is the child process running the benchmark's listeners.
type listeners struct {
	addrs []netip.AddrPort
	in    io.WriteCloser
	out   *bufio.Scanner
}

// startListeners starts n listeners in a child process, stopped when b ends.
func startListeners(b *testing.B, n int) *listeners {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), listenersEnv+"="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start the listener process: %v", err)
	}
	b.Cleanup(func() {
		in.Close()
		if err := cmd.Wait(); err != nil {
			b.Errorf("listener process: %v", err)
		}
	})
	l := &listeners{in: in, out: bufio.NewScanner(out)}
	for l.out.Scan() && l.out.Text() != "ready" {
		a, err := netip.ParseAddrPort(l.out.Text())
		if err != nil {
			b.Fatalf("listener process wrote %q: %v", l.out.Text(), err)
		}
		l.addrs = append(l.addrs, a)
	}
	if len(l.addrs) != n {
		b.Fatalf("listener process started %d of %d listeners", len(l.addrs), n)
	}
	return l
}

// cpu asks the listener process for the CPU time it used so far.
func (l *listeners) cpu(b *testing.B) time.Duration {
	if _, err := io.WriteString(l.in, "cpu\n"); err != nil {
		b.Fatal(err)
	}
	if !l.out.Scan() {
		b.Fatalf("listener process: no answer: %v", l.out.Err())
	}
	ns, err := strconv.ParseInt(l.out.Text(), 10, 64)
	if err != nil {
		b.Fatalf("listener process answered %q: %v", l.out.Text(), err)
	}
	return time.Duration(ns)
}

// benchDuration is how long a benchmark measures: 20 s, or
// HEALTH_BENCH_DURATION.
func benchDuration(b *testing.B) time.Duration {
	s := os.Getenv("HEALTH_BENCH_DURATION")
	if s == "" {
		return 20 * time.Second
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		b.Fatalf("HEALTH_BENCH_DURATION=%q: %v", s, err)
	}
	return d
}

// raiseFileLimit lifts RLIMIT_NOFILE to its hard limit (the listener process inherits it).
func raiseFileLimit(b *testing.B) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		b.Fatal(err)
	}
}

// processCPU is this process's user plus system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// memStatus reads a kB field of /proc/self/status, in MB.
func memStatus(b *testing.B, field string) float64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				b.Fatalf("%s: %v", line, err)
			}
			return kb / 1024
		}
	}
	b.Fatalf("no %s in /proc/self/status", field)
	return 0
}
