package discovery

import (
	"context"
	"slices"
	"testing"
	"time"
)

// percentiles returns the p50 and p99 of ds, sorting it.
func percentiles(ds []time.Duration) (p50, p99 time.Duration) {
	slices.Sort(ds)
	return ds[len(ds)/2], ds[(len(ds)*99)/100]
}

// timed runs f n times and returns each run's duration.
func timed(tb testing.TB, n int, f func() error) []time.Duration {
	tb.Helper()
	ds := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := f(); err != nil {
			tb.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	return ds
}

// Resolution + probe of a 3-node cluster on loopback, through an alias: the
// figures go to the test log; only a generous bound is asserted.
func TestDiscoverLatencyFigures(t *testing.T) {
	c := newCluster(t, 0, 0, 0)
	cl := c.client(t, Config{})
	ctx := t.Context()
	n := 500
	if testing.Short() {
		n = 50
	}
	ans, err := cl.Resolve(ctx, "prod.pgcluster.lan")
	if err != nil {
		t.Fatal(err)
	}
	resolve := timed(t, n, func() error { _, err := cl.Resolve(ctx, "prod.pgcluster.lan"); return err })
	probe := timed(t, n, func() error { cl.Rank(ctx, ans.Candidates); return nil })
	total := timed(t, n, func() error { _, err := cl.Discover(ctx, "prod.pgcluster.lan"); return err })
	for _, f := range []struct {
		what string
		ds   []time.Duration
	}{{"resolve", resolve}, {"probe", probe}, {"resolve+probe", total}} {
		p50, p99 := percentiles(f.ds)
		t.Logf("%-14s 3 nodes, %d runs: p50 %s p99 %s", f.what, n, p50.Round(time.Microsecond), p99.Round(time.Microsecond))
	}
	if _, p99 := percentiles(total); p99 > time.Second {
		t.Errorf("resolve+probe p99 %s, want well under a second on loopback", p99)
	}
}

// BenchmarkDiscover measures resolution + probe of a 3-node cluster on
// loopback, through an alias, and reports p50 and p99.
func BenchmarkDiscover(b *testing.B) {
	c := newCluster(b, 0, 0, 0)
	cl := c.client(b, Config{})
	benchmark(b, func(ctx context.Context) error { _, err := cl.Discover(ctx, "prod.pgcluster.lan"); return err })
}

// BenchmarkResolve measures the DNS part alone: SRV, A and AAAA in parallel,
// and the CNAME of the alias.
func BenchmarkResolve(b *testing.B) {
	c := newCluster(b, 0, 0, 0)
	cl := c.client(b, Config{})
	benchmark(b, func(ctx context.Context) error { _, err := cl.Resolve(ctx, "prod.pgcluster.lan"); return err })
}

// BenchmarkRank measures the probe round alone, 3 candidates in parallel.
func BenchmarkRank(b *testing.B) {
	c := newCluster(b, 0, 0, 0)
	cl := c.client(b, Config{})
	ans, err := cl.Resolve(b.Context(), "local.pgcluster.lan")
	if err != nil {
		b.Fatal(err)
	}
	benchmark(b, func(ctx context.Context) error { cl.Rank(ctx, ans.Candidates); return nil })
}

func benchmark(b *testing.B, f func(context.Context) error) {
	ctx := b.Context()
	var ds []time.Duration
	for b.Loop() {
		start := time.Now()
		if err := f(ctx); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	p50, p99 := percentiles(ds)
	b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
	b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
}
