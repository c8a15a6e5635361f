package lock

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// feedInstance is a coordinator whose checker is simulated: every target
// ticks once an interval, at a phase of its own, and a probe takes no time
// and finds the target up (see simulateChecks).
type feedInstance struct {
	coord  *Coordinator
	writes atomic.Int64 // status writes fenced in
	cancel context.CancelFunc
	done   chan struct{}
}

// feedWrites is an Observer that counts the status writes fenced in.
type feedWrites struct{ n *atomic.Int64 }

func (w feedWrites) Mode(string)               {}
func (w feedWrites) Leases(int)                {}
func (w feedWrites) Message(string)            {}
func (w feedWrites) Resync(error)              {}
func (w feedWrites) Propagation(time.Duration) {}
func (w feedWrites) Write(ok, _ bool) {
	if ok {
		w.n.Add(1)
	}
}

// startFeedInstance starts a coordinator with cfg on a client of its own to srv,
// its checks of targets simulated, until the test ends.
func startFeedInstance(t *testing.T, srv *redistest.Server, targets []health.Target, cfg Config) *feedInstance {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true,
		DialTimeout: MaxCallTimeout, ReadTimeout: MaxCallTimeout, WriteTimeout: MaxCallTimeout})
	t.Cleanup(func() { rdb.Close() })
	in := &feedInstance{done: make(chan struct{})}
	cfg.Observer = feedWrites{&in.writes}
	coord, err := NewCoordinator(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	in.coord = coord
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	kicked := make(chan string, len(targets))
	coord.SetProbeNow(func(key string) {
		select {
		case kicked <- key:
		default:
		}
	})
	coord.SetTargets(targets)
	var wg sync.WaitGroup
	wg.Go(func() { simulateChecks(ctx, coord, targets, cfg.Interval, kicked) })
	wg.Go(func() { coord.Run(ctx, func(health.View) {}) })
	go func() { wg.Wait(); close(in.done) }()
	t.Cleanup(func() { in.cancel(); <-in.done })
	return in
}

// feedSlots is how many ticks an interval of simulateChecks has.
const feedSlots = 20

// simulateChecks plays a checker for c until ctx is done: each target is
// claimed once an interval in the slot its index gives it (and at once
// when kicked), and when c says it probes it, its probe finds it up at
// once and is recorded. A slot's targets are claimed and recorded by up
// to 32 goroutines at a time, each target by one at a time (a target
// still busy skips its tick), so that the slots keep their pace when
// Redis is slow.
func simulateChecks(ctx context.Context, c *Coordinator, targets []health.Target, interval time.Duration, kicked <-chan string) {
	byKey := map[string]health.Target{}
	slots := make([][]health.Target, feedSlots)
	for i, tg := range targets {
		slots[i%feedSlots] = append(slots[i%feedSlots], tg)
		byKey[tg.Key] = tg
	}
	up := health.Progress{Verdict: health.Verdict{State: health.Up, Cause: health.CauseOK}, OK: 1}
	var mu sync.Mutex
	busy := map[string]bool{}
	sem := make(chan struct{}, 32)
	var wg sync.WaitGroup
	defer wg.Wait()
	probe := func(tg health.Target) {
		mu.Lock()
		if busy[tg.Key] {
			mu.Unlock()
			return
		}
		busy[tg.Key] = true
		mu.Unlock()
		wg.Go(func() {
			sem <- struct{}{}
			if ok, _ := c.Claim(tg); ok {
				c.Record(tg, up)
			}
			<-sem
			mu.Lock()
			delete(busy, tg.Key)
			mu.Unlock()
		})
	}
	tick := time.NewTicker(interval / feedSlots)
	defer tick.Stop()
	for slot := 0; ; {
		select {
		case <-ctx.Done():
			return
		case key := <-kicked:
			if tg, ok := byKey[key]; ok {
				probe(tg)
			}
		case <-tick.C:
			for _, tg := range slots[slot] {
				probe(tg)
			}
			slot = (slot + 1) % feedSlots
		}
	}
}

// feedTargets is n targets on addresses nobody listens on (the probes are
// simulated).
func feedTargets(n int) []health.Target {
	var ts []health.Target
	for i := range n {
		ts = append(ts, health.Target{Key: fmt.Sprintf("c%d/n%d", i/3, i%3),
			Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, byte(i >> 8), byte(i)}), 5432)})
	}
	return ts
}

// redisCalls reads Redis's calls per command (INFO commandstats):
// those scripts make are counted too.
func redisCalls(t *testing.T, rdb *redis.Client) map[string]int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		name, found := strings.CutPrefix(name, "cmdstat_")
		if !ok || !found {
			continue
		}
		n, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			t.Fatalf("INFO commandstats: %q", line)
		}
		calls[name] = v
	}
	return calls
}

// statusWriteCommands is what a status write costs Redis at steady state:
// the write script's call and the GET, TIME, HGET, HSET and two PEXPIREs
// it makes (one HGET each: no other script or call of the fleet's reads a
// single hash field).
const statusWriteCommands = 7

// A fleet's Redis work beyond its status writes does not grow with its
// targets: three coordinators (interval 2 s, simulated probes) at 200
// targets and at 1,000, each measured over 12 s at steady state (every
// lease held once). Redis counts every command, those scripts make too;
// a status write (one per target per interval, the fleet's M/T) costs a
// fixed number of them, the rest is heartbeats, leases, echo markers and
// reads of stored statuses, which must be as many a second per instance
// at 1,000 targets as at 200. (Reading every status every 10 s, as the
// fleet did, made them 41.5/s and 176.1/s; 2,000 targets are too many
// for a -race run on a loaded machine of two cores.)
func TestFeedCommandsFlatInTargets(t *testing.T) {
	if testing.Short() {
		t.Skip("measures for 30 s")
	}
	const n, interval, window = 3, 2 * time.Second, 12 * time.Second
	perInstance := map[int]float64{}
	for _, m := range []int{200, 1000} {
		srv := redistest.Start(t)
		admin := srv.Client(t)
		targets := feedTargets(m)
		var ins []*feedInstance
		for range n {
			ins = append(ins, startFeedInstance(t, srv, targets, Config{Prefix: "sim:", Interval: interval, Timeout: interval / 4, Logf: t.Logf}))
		}
		eventually(t, 30*time.Second, fmt.Sprintf("every one of %d leases held once", m), func() bool {
			total := 0
			for _, in := range ins {
				total += len(in.coord.Held())
			}
			return total == m
		})
		time.Sleep(2 * interval) // the takes' first writes and reads settle: a measurement starts at steady state
		before, w0 := redisCalls(t, admin), feedWritesOf(ins)
		time.Sleep(window) // a measurement window, not a synchronisation
		after, w1 := redisCalls(t, admin), feedWritesOf(ins)
		delete(after, "info")
		total, writes := int64(0), after["hget"]-before["hget"]
		var table []string
		for _, name := range slices.Sorted(maps.Keys(after)) {
			if d := after[name] - before[name]; d > 0 {
				total += d
				table = append(table, fmt.Sprintf("%s %.1f", name, float64(d)/window.Seconds()))
			}
		}
		secs := window.Seconds()
		rest := float64(total-statusWriteCommands*writes) / secs / n
		perInstance[m] = rest
		t.Logf("%d instances x %d targets, interval %v: %.0f Redis commands/s (scripts' included), %.0f status writes/s (M/T = %.0f; %d seen fenced in), %.1f commands/s per instance beyond the status writes",
			n, m, interval, float64(total)/secs, float64(writes)/secs, float64(m)/interval.Seconds(), w1-w0, rest)
		t.Logf("commands/s by name: %s", strings.Join(table, ", "))
		for _, in := range ins {
			in.cancel()
			<-in.done
		}
	}
	if perInstance[1000] > 1.5*perInstance[200]+5 {
		t.Errorf("Redis commands per instance beyond the status writes: %.1f/s at 1,000 targets, %.1f/s at 200: they grow with the targets",
			perInstance[1000], perInstance[200])
	}
}

func feedWritesOf(ins []*feedInstance) int64 {
	var n int64
	for _, in := range ins {
		n += in.writes.Load()
	}
	return n
}

// startCheckedWith is startChecked, calling setup with the coordinator
// before it runs.
func startCheckedWith(t *testing.T, rdb redis.UniversalClient, targets []health.Target, cfg Config, hc health.Config, setup func(*Coordinator)) *instance {
	t.Helper()
	coord, err := NewCoordinator(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	setup(coord)
	hc.Shared = coord
	check, err := health.New(hc)
	if err != nil {
		t.Fatal(err)
	}
	coord.SetProbeNow(check.ProbeNow)
	coord.SetTargets(targets)
	check.SetTargets(targets)
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{coord: coord, check: check, cancel: cancel, done: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Go(func() { check.Run(ctx, nil) })
	wg.Go(func() {
		coord.Run(ctx, func(v health.View) {
			in.mu.Lock()
			in.view = v
			in.mu.Unlock()
		})
	})
	go func() { wg.Wait(); close(in.done) }()
	t.Cleanup(in.stop)
	return in
}

// deafness makes a coordinator's subscription lose the messages of a key
// while it is on, as a subscription that missed them would: neither
// heard (their publish numbers) nor applied.
type deafness struct {
	key     string
	on      atomic.Bool
	dropped atomic.Int64
}

func (d *deafness) install(c *Coordinator) {
	heard, live := c.sub.Heard, c.sub.Live
	c.sub.Heard = func(key string, v int64, b []byte) {
		if !d.on.Load() || key != d.key {
			heard(key, v, b)
		}
	}
	c.sub.Live = func(key string, v int64, b []byte) {
		if d.on.Load() && key == d.key {
			d.dropped.Add(1)
			return
		}
		live(key, v, b)
	}
}

// resyncCounter is an Observer that counts the reads of every status.
type resyncCounter struct{ n *atomic.Int64 }

func (r resyncCounter) Mode(string)               {}
func (r resyncCounter) Leases(int)                {}
func (r resyncCounter) Message(string)            {}
func (r resyncCounter) Propagation(time.Duration) {}
func (r resyncCounter) Write(bool, bool)          {}
func (r resyncCounter) Resync(error)              { r.n.Add(1) }

// A message lost (the holder's "down" after its backend stopped, never
// heard by the other instance, which reads no status again on a timer:
// Resync an hour) is found by the holder's watermark: its heartbeat says
// it published more than was heard, and the other instance reads the
// holder's statuses again, applying its "down" within two cycles and a
// read of the publish, without subscribing again or reading every status.
func TestFeedGapRepairedByWatermark(t *testing.T) {
	srv := redistest.Start(t)
	b := newBackend(t)
	targets := []health.Target{{Key: "c/a", Addr: b.addr}}
	deaf := [2]*deafness{{key: "c/a"}, {key: "c/a"}}
	var resyncs [2]atomic.Int64
	var ins []*instance
	for i := range 2 {
		cfg := Config{Prefix: "fleet:", Interval: fleetInterval, Timeout: fleetTimeout, Resync: time.Hour, Logf: t.Logf, Observer: resyncCounter{&resyncs[i]}}
		hc := health.Config{Check: health.CheckTCP, Interval: fleetInterval, Timeout: fleetTimeout, Rise: 1, Fall: 1}
		ins = append(ins, startCheckedWith(t, newClient(t, srv), targets, cfg, hc, deaf[i].install))
	}
	tokens := []string{ins[0].coord.Token(), ins[1].coord.Token()}
	slices.Sort(tokens)
	tx, rx := 0, 1
	if owner(tokens, "c/a") == ins[1].coord.Token() {
		tx, rx = 1, 0
	}
	eventually(t, 10*time.Second, "the lease held by its owner alone, both see the backend up", func() bool {
		total, _ := totalHeld(ins)
		return total == 1 && len(ins[tx].coord.Held()) == 1 && allState(ins, targets, health.Up)()
	})
	holder := ins[tx].coord.Token()
	reads, full := ins[rx].coord.gapReads.Load(), resyncs[rx].Load()
	deaf[rx].on.Store(true)
	b.ln.Close()
	eventually(t, 5*time.Second, "the holder sees the backend down", func() bool { return ins[tx].state("c/a") == health.Down })
	published := time.Now()
	// The holder's down, applied: read again (the other instance may
	// also probe the backend itself while the gap is pending, and see it
	// down in its own view first).
	c := ins[rx].coord
	var r remoteStatus
	eventually(t, 5*time.Second, "the holder's down reaches the other instance", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		r = c.remote["c/a"]
		return r.Holder == holder && r.State == "down"
	})
	took := time.Since(published)
	eventually(t, 5*time.Second, "the other instance's view says down", func() bool { return ins[rx].state("c/a") == health.Down })
	bound := 2*fleetInterval/2 + MaxCallTimeout
	t.Logf("the holder's down, its message lost, applied by the other instance %v after the holder saw it (bound %v: two cycles and a read); %d messages lost, %d reads after a gap",
		took.Round(time.Millisecond), bound, deaf[rx].dropped.Load(), c.gapReads.Load()-reads)
	if deaf[rx].dropped.Load() == 0 {
		t.Fatal("no message of the key was lost: the test shows nothing")
	}
	if c.gapReads.Load() == reads {
		t.Error("no read after a gap: the down came another way")
	}
	if n := resyncs[rx].Load(); n != full {
		t.Errorf("%d reads of every status meanwhile, want none: the gap alone must repair it", n-full)
	}
	if took > bound+attackMargin {
		t.Errorf("the lost down applied %v after the holder saw it, over %v", took, bound+attackMargin)
	}
}

// cutOff makes an instance's Redis unreachable: new connections through
// its gate are refused, and its open ones, named name, are killed.
func cutOff(t *testing.T, admin *redis.Client, g *gate, name string) {
	t.Helper()
	g.closed.Store(true)
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(list, "\n") {
		if !strings.Contains(line, " name="+name+" ") {
			continue
		}
		for field := range strings.FieldsSeq(line) {
			if id, ok := strings.CutPrefix(field, "id="); ok {
				if err := admin.Do(context.Background(), "CLIENT", "KILL", "ID", id).Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// A holder that dies (cut off from Redis, its backend stopped at the same
// moment) stops covering its target within its membership's lapse and a
// cycle, and the stopped backend leaves the other instances' views within
// fall × interval + timeout + lease: its new owner takes the lease once
// the old one lapses and probes it at once.
func TestFeedHolderDiesStopsCovering(t *testing.T) {
	srv := redistest.Start(t)
	admin := srv.Client(t)
	b := newBackend(t)
	targets := []health.Target{{Key: "c/a", Addr: b.addr}}
	var ins []*instance
	var gates []*gate
	for i := range 3 {
		g := &gate{}
		gates = append(gates, g)
		rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, Dialer: g.dial, ClientName: fmt.Sprintf("instance%d", i),
			DialTimeout: CallTimeout, ReadTimeout: CallTimeout, WriteTimeout: CallTimeout})
		t.Cleanup(func() { rdb.Close() })
		ins = append(ins, startInstance(t, rdb, targets))
	}
	var tokens []string
	for _, in := range ins {
		tokens = append(tokens, in.coord.Token())
	}
	slices.Sort(tokens)
	dead := 0
	for i, in := range ins {
		if owner(tokens, "c/a") == in.coord.Token() {
			dead = i
		}
	}
	eventually(t, 10*time.Second, "the lease held by its owner alone, every instance sees the backend up", func() bool {
		total, _ := totalHeld(ins)
		return total == 1 && len(ins[dead].coord.Held()) == 1 && allState(ins, targets, health.Up)()
	})
	var rest []*instance
	for i, in := range ins {
		if i != dead {
			rest = append(rest, in)
		}
	}
	ttl := ins[dead].coord.LeaseTTL()
	at := time.Now()
	cutOff(t, admin, gates[dead], fmt.Sprintf("instance%d", dead))
	b.ln.Close()
	covers := func(in *instance) bool {
		c := in.coord
		c.mu.Lock()
		defer c.mu.Unlock()
		r, ok := c.remote["c/a"]
		return ok && r.Holder == ins[dead].coord.Token() && c.covered("c/a", b.addr)
	}
	eventually(t, ttl+attackMargin, "the dead holder's status covers c/a nowhere", func() bool {
		return !covers(rest[0]) && !covers(rest[1])
	})
	uncovered := time.Since(at)
	eventually(t, attackBound+attackMargin, "c/a down in every live view", allState(rest, targets, health.Down))
	down := time.Since(at)
	t.Logf("holder cut off from Redis with its backend stopped: its status stopped covering after %v (its membership lasts %v), the backend left every other view after %v (bound %v: fall x interval + timeout + lease)",
		uncovered.Round(time.Millisecond), ttl-fleetInterval/2, down.Round(time.Millisecond), attackBound)
	if down > attackBound+attackMargin {
		t.Errorf("the backend left the views %v after its holder died, over %v", down, attackBound+attackMargin)
	}
	eventually(t, 5*time.Second, "a live instance holds the lease", func() bool {
		total, _ := totalHeld(rest)
		return total == 1
	})
}
