package lock

import (
	"bufio"
	"context"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisStats is what INFO says of a redis-server at one moment.
type redisStats struct {
	at    time.Time
	calls map[string]int64 // commandstats: calls per command, those scripts run included
	cpu   float64          // used_cpu_sys + used_cpu_user, seconds
	mem   int64            // used_memory, bytes
	rss   int64            // used_memory_rss, bytes
	ok    bool             // INFO answered
}

// readRedisStats reads INFO commandstats, cpu and memory.
func readRedisStats(ctx context.Context, admin *redis.Client) (redisStats, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	info, err := admin.Info(ctx, "commandstats", "cpu", "memory").Result()
	st := redisStats{at: time.Now(), calls: map[string]int64{}}
	if err != nil {
		return st, err
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, value, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		switch {
		case strings.HasPrefix(name, "cmdstat_"):
			// cmdstat_evalsha:calls=123,usec=...,usec_per_call=...
			for _, f := range strings.Split(value, ",") {
				if n, ok := strings.CutPrefix(f, "calls="); ok {
					st.calls[strings.TrimPrefix(name, "cmdstat_")], _ = strconv.ParseInt(n, 10, 64)
				}
			}
		case name == "used_cpu_sys" || name == "used_cpu_user":
			f, _ := strconv.ParseFloat(value, 64)
			st.cpu += f
		case name == "used_memory":
			st.mem, _ = strconv.ParseInt(value, 10, 64)
		case name == "used_memory_rss":
			st.rss, _ = strconv.ParseInt(value, 10, 64)
		}
	}
	st.ok = sc.Err() == nil
	return st, sc.Err()
}

// commandRate is one command's calls per second between two readings.
type commandRate struct {
	name string
	rate float64
}

// rates returns the calls per second of every command between a and b,
// busiest first, and their total.
func rates(a, b redisStats) ([]commandRate, float64) {
	secs := b.at.Sub(a.at).Seconds()
	var out []commandRate
	total := 0.0
	for name, n := range b.calls {
		if d := n - a.calls[name]; d > 0 {
			out = append(out, commandRate{name, float64(d) / secs})
			total += float64(d) / secs
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].rate > out[j].rate })
	return out, total
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// processRSS is this process's resident set, bytes (/proc/self/status).
func processRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// loadAverage is the machine's load average over the last minute
// (/proc/loadavg): the other processes this one shares the cores with.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// sentCounter is a go-redis hook that counts the commands an instance
// sends and the round trips they take (a pipeline is one), so that what
// the instances ask of Redis shows apart from what the scripts they call
// run inside it (commandstats counts both).
//
// While calls is on, it also times each command that is not in a
// pipeline, as the instance saw it: its wait for a connection of the pool
// and for this process to run the reply's goroutine included.
type sentCounter struct {
	cmds, trips *atomic.Int64
	calls       *callTimes
}

func (h sentCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h sentCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cmds.Add(1)
		h.trips.Add(1)
		if h.calls == nil || !h.calls.on.Load() {
			return next(ctx, cmd)
		}
		start := time.Now()
		err := next(ctx, cmd)
		h.calls.add(time.Since(start))
		return err
	}
}

// callTimes collects how long the instances' Redis calls took while on.
type callTimes struct {
	on   atomic.Bool
	mu   sync.Mutex
	took []time.Duration
}

func (c *callTimes) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.took = append(c.took, d)
}

// sorted returns the durations collected, sorted.
func (c *callTimes) sorted() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Clone(c.took)
	slices.Sort(out)
	return out
}

// slowRedis makes srv's slow log keep every command that runs longer than
// slowCommand, from now on.
func slowRedis(ctx context.Context, admin *redis.Client) error {
	if err := admin.ConfigSet(ctx, "slowlog-log-slower-than", strconv.FormatInt(slowCommand.Microseconds(), 10)).Err(); err != nil {
		return err
	}
	if err := admin.ConfigSet(ctx, "slowlog-max-len", "1024").Err(); err != nil {
		return err
	}
	return admin.SlowLogReset(ctx).Err()
}

// slowCommand is how long a command runs inside Redis before the flips'
// report counts it as slow: well above a status write's 40 µs.
const slowCommand = 5 * time.Millisecond

// slowCommands returns how many commands Redis's slow log kept (at most
// 1,024) and the longest of them.
func slowCommands(ctx context.Context, admin *redis.Client) (int, time.Duration, error) {
	logs, err := admin.SlowLogGet(ctx, 1024).Result()
	if err != nil {
		return 0, 0, err
	}
	var longest time.Duration
	for _, l := range logs {
		longest = max(longest, l.Duration)
	}
	return len(logs), longest, nil
}

func (h sentCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.cmds.Add(int64(len(cmds)))
		h.trips.Add(1)
		return next(ctx, cmds)
	}
}
