package health

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgconn"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// BenchmarkRolePollCost measures what the sessions of RoleInterval cost: 1,000
// targets spread over 3 real PostgreSQL servers, each with its session and a
// poll every 100 ms, for 20 s once every session is open
// (HEALTH_BENCH_DURATION and HEALTH_BENCH_SESSIONS override). It reports the servers' CPU per poll
// (every process of the three, from /proc/PID/schedstat, which counts
// nanoseconds on CPU, over the polls the checker ran) and this checker's
// CPU in cores (getrusage), then the floor: a bare prepared SELECT 1 on as
// many idle sessions at the same rate (see bareQueryCost). Interval
// is long (1 min): the probes' connects are not what is measured. Goals: at
// most 15 µs of server CPU per poll, at most 0.2 core for the checker.
//
//	go test -run '^$' -bench RolePollCost ./health/
func BenchmarkRolePollCost(b *testing.B) {
	const roleInterval = 100 * time.Millisecond
	targets := 1000
	if s := os.Getenv("HEALTH_BENCH_SESSIONS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("HEALTH_BENCH_SESSIONS=%q: want a count", s)
		}
		targets = n
	}
	duration := benchDuration(b)
	raiseFileLimit(b)
	var servers []*pgtest.Postgres
	for i := range 3 {
		servers = append(servers, pgtest.New(b, pgtest.Options{Host: fmt.Sprintf("127.0.0.%d", 81+i),
			Settings: map[string]string{"max_connections": "400"}}))
	}
	var ts []Target
	for i := range targets {
		pg := servers[i%len(servers)]
		ts = append(ts, Target{Key: fmt.Sprintf("c/n%d", i), Addr: netip.AddrPortFrom(netip.MustParseAddr(pg.Host), uint16(pg.Port))})
	}
	var open atomic.Int32
	c, err := New(Config{Check: CheckPostgres, Options: "user=postgres dbname=postgres sslmode=disable", Interval: time.Minute,
		Timeout: 5 * time.Second, Rise: 1, Fall: 2, RoleInterval: roleInterval,
		ObserveSession: func(d int) { open.Add(int32(d)) }})
	if err != nil {
		b.Fatal(err)
	}
	c.SetTargets(ts)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx, nil) }()
	defer func() { cancel(); <-done }()
	// Every target's first probe falls within the first Interval; then
	// measure what is open (a session whose connect failed opens again at
	// the next probe, a minute later). A machine that cannot hold them all
	// is measured as it is: the figures say how many were open.
	err = pgtest.WaitFor(2*time.Minute, func() error {
		if n := open.Load(); int(n) < targets*95/100 {
			return fmt.Errorf("%d sessions open, want at least 95%% of %d", n, targets)
		}
		return nil
	})
	if err != nil {
		fmt.Printf("role polls: %v; measuring those\n", err)
	}
	b.ResetTimer()

	serverCPU := func() (d time.Duration) {
		for _, pg := range servers {
			d += treeCPU(b, pg)
		}
		return d
	}
	n0 := open.Load()
	c0, s0, p0, t0 := c.polls.Load(), serverCPU(), processCPU(), time.Now()
	time.Sleep(duration) // the measurement window
	c1, s1, p1, t1 := c.polls.Load(), serverCPU(), processCPU(), time.Now()
	polls := c1 - c0
	wall := t1.Sub(t0)
	perPoll := time.Duration(int64(s1-s0) / max(polls, 1))
	checker := (p1 - p0).Seconds() / wall.Seconds()
	want := float64(targets) * wall.Seconds() / roleInterval.Seconds()
	b.ReportMetric(float64(perPoll.Nanoseconds())/1e3, "server-µs/poll")
	b.ReportMetric(checker, "checker-cores")
	b.ReportMetric(float64(polls)/wall.Seconds(), "polls/s")
	fmt.Printf("role polls: %d targets over %d servers, %d sessions open at the start and %d at the end, role_interval %v, %v: %d polls (%.0f for every target), %.1f µs of server CPU per poll, checker %.3f cores\n",
		targets, len(servers), n0, open.Load(), roleInterval, wall.Round(time.Millisecond), polls, want, float64(perPoll.Nanoseconds())/1e3, checker)

	// The floor: what a bare SELECT 1, prepared, costs these servers on
	// as many idle sessions at the same rate. A server process woken from
	// idle costs what it costs on this machine whatever the query; the
	// poll's own share is the difference.
	cancel()
	<-done
	floor, n := bareQueryCost(b, servers, int(max(n0, 1)), roleInterval, duration/2)
	b.ReportMetric(float64(floor.Nanoseconds())/1e3, "floor-server-µs/query")
	fmt.Printf("role polls: the floor, SELECT 1 prepared on %d idle sessions every %v: %d queries, %.1f µs of server CPU per query\n",
		max(n0, 1), roleInterval, n, float64(floor.Nanoseconds())/1e3)
}

// bareQueryCost opens sessions sessions over servers, each running a
// prepared SELECT 1 every every, and returns the servers' CPU per query
// over window (once every session is open), and the queries counted.
func bareQueryCost(b *testing.B, servers []*pgtest.Postgres, sessions int, every, window time.Duration) (time.Duration, int64) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var queries, open atomic.Int64
	for i := range sessions {
		pg := servers[i%len(servers)]
		wg.Go(func() {
			conn, err := pgconn.Connect(ctx, fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", pg.Host, pg.Port))
			if err != nil {
				return
			}
			defer conn.Close(context.Background())
			if _, err := conn.Prepare(ctx, "floor", "SELECT 1", nil); err != nil {
				return
			}
			open.Add(1)
			t := time.NewTicker(every)
			defer t.Stop()
			// Spread over the interval, as the checker's polls are.
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Duration(rand.Int64N(int64(every)))):
			}
			for {
				if _, err := conn.ExecPrepared(ctx, "floor", nil, nil, nil).Close(); err != nil {
					return
				}
				queries.Add(1)
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
			}
		})
	}
	if err := pgtest.WaitFor(time.Minute, func() error {
		if n := open.Load(); int(n) < sessions*95/100 {
			return fmt.Errorf("%d sessions open, want at least 95%% of %d", n, sessions)
		}
		return nil
	}); err != nil {
		b.Fatalf("the floor's sessions: %v", err)
	}
	serverCPU := func() (d time.Duration) {
		for _, pg := range servers {
			d += treeCPU(b, pg)
		}
		return d
	}
	q0, s0 := queries.Load(), serverCPU()
	time.Sleep(window) // the measurement window
	q1, s1 := queries.Load(), serverCPU()
	return time.Duration(int64(s1-s0) / max(q1-q0, 1)), q1 - q0
}

// treeCPU is the CPU time of pg's postmaster and every process it started
// (its backends, the checkpointer, ...), from /proc/PID/schedstat.
func treeCPU(b *testing.B, pg *pgtest.Postgres) time.Duration {
	pidFile, err := os.ReadFile(filepath.Join(pg.Dir, "data", "postmaster.pid"))
	if err != nil {
		b.Fatal(err)
	}
	first, _, _ := strings.Cut(string(pidFile), "\n")
	postmaster, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil {
		b.Fatalf("postmaster.pid: %v", err)
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pid != postmaster && parentOf(pid) != postmaster {
			continue
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			continue // gone meanwhile
		}
		ns, err := strconv.ParseInt(strings.Fields(string(data))[0], 10, 64)
		if err == nil {
			total += time.Duration(ns)
		}
	}
	return total
}

// parentOf is a process's parent pid, 0 when it cannot be read.
func parentOf(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}
