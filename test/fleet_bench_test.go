package test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// BenchmarkFleet measures what coordinating through Redis costs and how fast
// it converges, on three bin/coredns processes, a real redis-server and ten
// real TCP backends on loopback, interval 500ms: probes per backend over 20 s
// (one prober: 40), Redis commands per second at steady state, the spread
// between the first and the last instance to drop (or take back) a flipped
// backend over 20 flips each way, and the longest a backend goes unprobed when
// the instance holding the most leases is SIGKILLed. b.N is ignored: one run
// is one measurement.
//
//	go test -run '^$' -bench Fleet -benchtime 1x ./test/
func BenchmarkFleet(b *testing.B) {
	const (
		interval = 500 * time.Millisecond
		timeout  = 200 * time.Millisecond
		window   = 20 * time.Second
		flips    = 20
	)
	rs := redistest.Start(b)
	f := newFleet(b, fleetOptions{interval: interval, timeout: timeout, backends: 10})
	corefile := f.corefile(rs.URL())
	ins := startInstances(b, corefile, 3)
	Eventually(b, 30*time.Second, coordinated(b, ins, len(f.backends)))
	Eventually(b, 30*time.Second, answersExactly(ins, f.hosts()))
	time.Sleep(2 * interval) // let the first probes and takes settle before measuring

	// 1 and 8: probes per backend and Redis commands over the window.
	rdb := rs.Client(b)
	ctx := context.Background()
	stats := func() (total int64, per map[string]int64) {
		info, err := rdb.Info(ctx, "stats", "commandstats").Result()
		if err != nil {
			b.Fatal(err)
		}
		per = map[string]int64{}
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
				total, _ = strconv.ParseInt(v, 10, 64)
			}
			if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
				name, fields, _ := strings.Cut(rest, ":")
				calls, _, _ := strings.Cut(strings.TrimPrefix(fields, "calls="), ",")
				per[name], _ = strconv.ParseInt(calls, 10, 64)
			}
		}
		return total, per
	}
	from := time.Now()
	c0, per0 := stats()
	time.Sleep(window) // the measurement window
	c1, per1 := stats()
	to := time.Now()
	secs := to.Sub(from).Seconds()
	var counts []int
	for _, bk := range f.backends {
		counts = append(counts, len(bk.AcceptsIn(from, to)))
	}
	want := int(to.Sub(from) / interval)
	fmt.Printf("dedup: probes per backend in %.1fs at interval %v: %v (one prober: %d; three: %d)\n", secs, interval, counts, want, 3*want)
	cmds := float64(c1-c0) / secs
	fmt.Printf("redis: %.1f commands/s for %d backends (%.2f per backend; floor M/T = %.1f)\n",
		cmds, len(f.backends), cmds/float64(len(f.backends)), float64(len(f.backends))/interval.Seconds())
	var names []string
	for n := range per1 {
		if per1[n] > per0[n] {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Printf("redis:   %-12s %.1f/s\n", n, float64(per1[n]-per0[n])/secs)
	}
	b.ReportMetric(float64(slices.Min(counts)), "min-probes/backend")
	b.ReportMetric(float64(slices.Max(counts)), "max-probes/backend")
	b.ReportMetric(cmds/float64(len(f.backends)), "redis-cmds/s/backend")

	// 2: propagation spread over flips.
	var downs, ups []time.Duration
	for k := range flips {
		i := k % len(f.backends)
		downs = append(downs, spread(f.dropTimes(b, ins, i, true)))
		ups = append(ups, spread(f.dropTimes(b, ins, i, false)))
	}
	all := append(slices.Clone(downs), ups...)
	fmt.Printf("propagation spread (first to last instance), %d flips: down p50 %v p99 %v; up p50 %v p99 %v; all p50 %v p99 %v max %v\n",
		flips, percentile(downs, 50), percentile(downs, 99), percentile(ups, 50), percentile(ups, 99),
		percentile(all, 50), percentile(all, 99), slices.Max(all))
	b.ReportMetric(float64(percentile(all, 99).Microseconds())/1000, "spread-p99-ms")

	// 3: SIGKILL the instance with the most leases.
	victim, most := 0, -1.0
	for k, in := range ins {
		if n := metric(b, in, leasesMetric); n > most {
			victim, most = k, n
		}
	}
	Eventually(b, 10*time.Second, answersExactly(ins, f.hosts()))
	killed := time.Now()
	ins[victim].Kill()
	rest := slices.Delete(slices.Clone(ins), victim, victim+1)
	Eventually(b, 30*time.Second, coordinated(b, rest, len(f.backends)))
	time.Sleep(2 * interval) // probes after the takeover, to close the gaps
	var worst time.Duration
	for _, bk := range f.backends {
		worst = max(worst, maxGap(bk, killed.Add(-interval), time.Now()))
	}
	ttl := max(3*interval+timeout, time.Second)
	fmt.Printf("takeover: SIGKILL of the holder of %v leases: longest gap between probes of a backend %v (lease %v + interval %v = %v)\n",
		most, worst.Round(time.Millisecond), ttl, interval, ttl+interval)
	b.ReportMetric(float64(worst.Milliseconds()), "takeover-gap-ms")
}
