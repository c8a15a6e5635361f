package test

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// BenchmarkFleetScale starts a fleet of real bin/coredns processes at once
// (a rollout of a new Deployment) over many real TCP backends on loopback,
// sharing their checks through one redis-server, and watches whether it
// settles to one probe per backend per interval and stays there: a fleet
// whose instances take a missed Redis deadline for an outage probes every
// backend from every instance, and the connects that adds starve the next
// instances' Redis calls (a probe storm).
//
// Every probe's accept is counted in 100 ms buckets. Printed: the probes
// per backend per interval in each 10 s window (1.00: one prober), when
// the fleet settled (from the start, to the first 10 s window within
// 1.00 ± 0.05 after which every window stays there), the peak 100 ms
// bucket against the steady state's, the instances' CPU over the last
// 30 s (/proc/<pid>/stat), how many times instances went into local mode
// (their log lines), and the machine's load average and sockets
// (/proc/loadavg, /proc/net/sockstat) at the end. b.N is ignored: one run is one
// measurement.
//
// FLEET_SCALE_INSTANCES (default 40), FLEET_SCALE_BACKENDS (1000) and
// FLEET_SCALE_HOLD (how long it watches after the start, default 5m30s:
// 30 s to settle and 5 minutes held) size it. The backends make clusters
// of FLEET_SCALE_CLUSTER_NODES (default 3: a primary and two standbys, as
// PostgreSQL clusters go; each flip builds its cluster's names again, so
// 1,000 in one cluster costs every instance a 1,000-node build per flip);
// check tcp, interval 2s,
// timeout 500ms, rise 1, fall 1. FLEET_SCALE_LOGS names a directory that
// keeps the instances' logs, each line after the time it was written.
// FLEET_SCALE_REDIS_NICE runs redis-server at that nice value (-15: ahead
// of everything else), standing for a Redis on a machine of its own: on
// a shared 2-core machine 40 instances, 1,000 listeners and Redis at one
// priority starve Redis, the instances' calls miss their deadlines and
// they go local (measured: with -15 they settle, without they do not).
// FLEET_SCALE_GOMAXPROCS runs each instance with that GOMAXPROCS, as
// automaxprocs sets it in a pod whose CPU limit is under a core (1), where
// on 2 shared cores each Go runtime would otherwise keep two processors
// busy looking for work.
//
//	go test -run '^$' -bench FleetScale -benchtime 1x -timeout 30m ./test/
func BenchmarkFleetScale(b *testing.B) {
	const (
		interval = 2 * time.Second
		timeout  = 500 * time.Millisecond
		window   = 10 * time.Second
		bucket   = 100 * time.Millisecond
	)
	n := envInt(b, "FLEET_SCALE_INSTANCES", 40)
	m := envInt(b, "FLEET_SCALE_BACKENDS", 1000)
	size := envInt(b, "FLEET_SCALE_CLUSTER_NODES", 3)
	hold := 5*time.Minute + 30*time.Second
	if v := os.Getenv("FLEET_SCALE_HOLD"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			b.Fatalf("FLEET_SCALE_HOLD=%q: %v", v, err)
		}
		hold = d
	}

	rs := redistest.Start(b)
	// Redis on a machine of its own, as a fleet deploys it, rather than
	// one process among the fleet's on two cores.
	if nice, set, err := rs.NiceFromEnv("FLEET_SCALE_REDIS_NICE"); err != nil {
		b.Fatal(err)
	} else if set {
		fmt.Printf("fleet scale: redis-server runs at nice %d (its main thread)\n", nice)
	}
	if v := os.Getenv("FLEET_SCALE_GOMAXPROCS"); v != "" {
		// Each instance as a pod with a CPU limit under one core, where
		// automaxprocs gives it one P: the instances inherit it, this
		// process (the backends' listeners) keeps its own.
		if p, err := strconv.Atoi(v); err != nil || p < 1 {
			b.Fatalf("FLEET_SCALE_GOMAXPROCS=%q: not a count", v)
		}
		b.Setenv("GOMAXPROCS", v)
		fmt.Printf("fleet scale: each instance runs with GOMAXPROCS=%s\n", v)
	}
	reg := Registry(b)
	counts := newProbeCounter(hold+time.Minute, bucket)
	var rows []string
	for i := range m {
		host := fmt.Sprintf("127.1.%d.%d", i/250, i%250+1)
		port := listenCounting(b, host, counts)
		role := "standby"
		if i%size == 0 {
			role = "primary"
		}
		rows = append(rows, fmt.Sprintf("('c%d', 'n%d', '%s', %d, '%s')", i/size, i, host, port, role))
	}
	for c := range slices.Chunk(rows, 500) {
		reg.MustExec(b, "INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES "+strings.Join(c, ", "))
	}
	corefile := fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n prometheus 127.0.0.1:%s\n pgcluster {\n  postgres %s\n  allow_loopback\n  check tcp\n  interval %v\n  timeout %v\n  rise 1\n  fall 1\n  redis %s\n }\n}\n",
		Zone, PortPlaceholder, MetricsPlaceholder, reg.DSN(""), interval, timeout, rs.URL())

	// Started together, as a rollout's pods are.
	counts.start(time.Now())
	start := time.Now()
	ins := make([]*Instance, n)
	var wg sync.WaitGroup
	for i := range ins {
		wg.Go(func() { ins[i] = StartFleetInstanceNoWait(b, corefile) })
	}
	wg.Wait()
	fmt.Printf("fleet scale: %d instances x %d backends, interval %v: started in %v\n", n, m, interval, time.Since(start).Round(time.Millisecond))
	// The fleet's CPU and the machine's load in each window, sampled
	// beside the run: what a storm starts from.
	samples := sampleWindows(ins, start, window, hold)

	// The instances' CPU over the last part of the window, from /proc:
	// what one instance costs once the fleet has settled (or not).
	cpuWindow := min(30*time.Second, hold/3)
	time.Sleep(time.Until(start.Add(hold - cpuWindow)))
	before, cpuFrom := fleetCPU(b, ins), time.Now()
	time.Sleep(time.Until(start.Add(hold))) // the window watched
	// A starved benchmark wakes late: the window is what it was.
	cpu, cpuWindow := fleetCPU(b, ins)-before, time.Since(cpuFrom)
	end := time.Now()

	perInterval := func(from, to time.Time) float64 {
		return float64(counts.between(from, to)) / float64(m) / (to.Sub(from).Seconds() / interval.Seconds())
	}
	var settled time.Duration = -1
	var worst float64
	var line []string
	for from := start; !from.Add(window).After(end); from = from.Add(window) {
		r := perInterval(from, from.Add(window))
		line = append(line, fmt.Sprintf("%.2f", r))
		if r < 0.95 || r > 1.05 {
			settled = -1
			worst = 0
			continue
		}
		if settled < 0 {
			settled = from.Sub(start)
		}
		worst = max(worst, abs(r-1))
	}
	fmt.Printf("fleet scale: probes per backend per interval, each %v from the start: %s\n", window, strings.Join(line, " "))
	// Local mode, from the instances' logs (one line each time; metrics
	// scraped from a starved fleet miss most of it): in which window, and
	// what the line says Redis did.
	local := make([]int, len(line))
	wentLocal, instancesLocal := 0, 0
	why := map[string]int{}
	for _, in := range ins {
		k := 0
		// Each line after the time it was written (15:04:05.000, today).
		for l := range strings.Lines(in.StampedLog()) {
			const stamp, said = "15:04:05.000", "Redis does not answer ("
			i := strings.Index(l, said)
			if i < 0 || !strings.Contains(l, "checking every backend locally until it does") || len(l) < len(stamp) {
				continue
			}
			k++
			cause := l[i+len(said):]
			why[cause[:max(strings.LastIndex(cause, "): checking"), 0)]]++
			if t, err := time.ParseInLocation(stamp, l[:len(stamp)], time.Local); err == nil {
				y, mo, d := start.Date()
				at := time.Date(y, mo, d, t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.Local)
				if w := int(at.Sub(start) / window); w >= 0 && w < len(local) {
					local[w]++
				}
			}
		}
		if k > 0 {
			wentLocal += k
			instancesLocal++
		}
	}
	ws := <-samples
	fmt.Printf("fleet scale: %8s %8s %12s %8s %8s\n", "from", "probes", "fleet cores", "load", "local")
	for i := range line {
		cores, load := "-", "-"
		if i < len(ws) {
			cores, load = fmt.Sprintf("%.2f", ws[i].cpu.Seconds()/window.Seconds()), ws[i].load
		}
		fmt.Printf("fleet scale: %8v %8s %12s %8s %8d\n", time.Duration(i)*window, line[i], cores, load, local[i])
	}
	if settled < 0 {
		fmt.Printf("fleet scale: NOT settled to 1.00 ± 0.05 by the end (%v)\n", hold)
	} else {
		fmt.Printf("fleet scale: settled to 1.00 ± 0.05 at %v after the start and stayed there for %v (largest deviation %.3f)\n",
			settled, end.Sub(start.Add(settled)).Round(time.Second), worst)
	}
	steady := float64(m) / interval.Seconds() * bucket.Seconds()
	peak, at := counts.peak()
	fmt.Printf("fleet scale: peak %d probes in a %v bucket at %v after the start; steady state %.0f (x%.2f)\n",
		peak, bucket, at.Round(bucket), steady, float64(peak)/steady)
	fmt.Printf("fleet scale: CPU over the last %v: %.2f cores for the fleet, %.2f%% of a core per instance\n",
		cpuWindow.Round(time.Second), cpu.Seconds()/cpuWindow.Seconds(), 100*cpu.Seconds()/cpuWindow.Seconds()/float64(n))
	fmt.Printf("fleet scale: instances went into local mode %d times (%d of %d instances, from their logs)\n", wentLocal, instancesLocal, n)
	for _, cause := range slices.Sorted(maps.Keys(why)) {
		fmt.Printf("fleet scale:   %4d x %s\n", why[cause], cause)
	}
	load, _ := os.ReadFile("/proc/loadavg")
	sock, _ := os.ReadFile("/proc/net/sockstat")
	fmt.Printf("fleet scale: load average %s", load)
	for l := range strings.Lines(string(sock)) {
		if strings.HasPrefix(l, "sockets:") || strings.HasPrefix(l, "TCP:") {
			fmt.Printf("fleet scale: %s", l)
		}
	}
	if dir := os.Getenv("FLEET_SCALE_LOGS"); dir != "" {
		for i, in := range ins {
			name := fmt.Sprintf("%s/instance-%02d.log", dir, i)
			if err := os.WriteFile(name, []byte(in.StampedLog()), 0o644); err != nil {
				b.Errorf("keeping an instance's log: %v", err)
			}
		}
		fmt.Printf("fleet scale: the instances' logs, each line after its time, are in %s\n", dir)
	}
	// Measured: a starved fleet's graceful stops take minutes each, and
	// even its kills, one after the other, took minutes: all at once.
	var killed sync.WaitGroup
	for _, in := range ins {
		killed.Go(in.Kill)
	}
	killed.Wait()
}

// windowSample is the fleet's CPU time in one window and the machine's
// one-minute load average at its end.
type windowSample struct {
	cpu  time.Duration
	load string
}

// sampleWindows samples the instances' CPU and the load average at the
// end of each window from start until hold has passed, then sends the
// samples. It reads /proc without failing the benchmark: an instance
// that exited adds nothing.
func sampleWindows(ins []*Instance, start time.Time, window, hold time.Duration) <-chan []windowSample {
	out := make(chan []windowSample, 1)
	cpu := func() time.Duration {
		d, _ := readFleetCPU(ins)
		return d
	}
	go func() {
		var ws []windowSample
		last := cpu()
		for at := start.Add(window); !at.After(start.Add(hold)); at = at.Add(window) {
			time.Sleep(time.Until(at))
			now := cpu()
			load, _ := os.ReadFile("/proc/loadavg")
			ws = append(ws, windowSample{cpu: now - last, load: strings.Fields(string(load) + " -")[0]})
			last = now
		}
		out <- ws
	}()
	return out
}

// fleetCPU is the CPU time the instances' processes have used so far
// (procCPU); one that cannot be read fails the benchmark.
func fleetCPU(b *testing.B, ins []*Instance) time.Duration {
	d, err := readFleetCPU(ins)
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// readFleetCPU is fleetCPU's sum, over the instances that can be read,
// with the first error, for a caller that must not fail the benchmark
// (another goroutine's).
func readFleetCPU(ins []*Instance) (time.Duration, error) {
	var d time.Duration
	var first error
	for _, in := range ins {
		v, err := readProcCPU(in.Pid())
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		d += v
	}
	return d, first
}

// probeCounter counts probes in fixed buckets from its start.
type probeCounter struct {
	bucket time.Duration
	from   atomic.Int64 // Unix ns of the start; 0 before
	n      []atomic.Int64
}

func newProbeCounter(span, bucket time.Duration) *probeCounter {
	return &probeCounter{bucket: bucket, n: make([]atomic.Int64, span/bucket+1)}
}

func (c *probeCounter) start(t time.Time) { c.from.Store(t.UnixNano()) }

func (c *probeCounter) add(t time.Time) {
	from := c.from.Load()
	if from == 0 {
		return
	}
	if i := int(time.Duration(t.UnixNano()-from) / c.bucket); i >= 0 && i < len(c.n) {
		c.n[i].Add(1)
	}
}

// between counts the probes of the buckets wholly in [from, to).
func (c *probeCounter) between(from, to time.Time) int64 {
	base := time.Unix(0, c.from.Load())
	var sum int64
	for i := int(from.Sub(base) / c.bucket); i < int(to.Sub(base)/c.bucket) && i < len(c.n); i++ {
		sum += c.n[i].Load()
	}
	return sum
}

// peak is the fullest bucket and when it began, from the start.
func (c *probeCounter) peak() (int64, time.Duration) {
	var most int64
	var at int
	for i := range c.n {
		if v := c.n[i].Load(); v > most {
			most, at = v, i
		}
	}
	return most, time.Duration(at) * c.bucket
}

// listenCounting accepts and closes every connection to host on a free
// port, counting each in c; it returns the port.
func listenCounting(t testing.TB, host string, c *probeCounter) int {
	t.Helper()
	l, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatalf("listen on %s: %v", host, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			c.add(time.Now())
			conn.Close()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

// envInt is the positive integer in the environment variable name, or def.
func envInt(t testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: not a positive integer", name, v)
	}
	return n
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}
