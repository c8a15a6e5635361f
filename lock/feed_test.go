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
	upsets atomic.Int64 // switches to local mode and reads of every status
	cancel context.CancelFunc
	done   chan struct{}
}

// feedObserver is an Observer that counts an instance's status writes
// fenced in, and what upsets a steady state: local mode (a loaded machine
// can make Redis calls miss their deadlines for two cycles), leases taken
// or released (a member whose heartbeats came too late lapsed), and the
// reads of every status that follow a return or a new subscription.
type feedObserver struct{ in *feedInstance }

func (o feedObserver) Mode(m string) {
	if m == ModeLocal {
		o.in.upsets.Add(1)
	}
}
func (o feedObserver) Leases(int)                { o.in.upsets.Add(1) }
func (o feedObserver) Message(string)            {}
func (o feedObserver) Resync(error)              { o.in.upsets.Add(1) }
func (o feedObserver) Propagation(time.Duration) {}
func (o feedObserver) Extend(int, int)           {}
func (o feedObserver) Write(ok, _ bool) {
	if ok {
		o.in.writes.Add(1)
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
	cfg.Observer = feedObserver{in}
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
// the write script's call and the GET, TIME, HGET, HSET and the lease's
// PEXPIRE it makes (one HGET each: no other script or call of the fleet's
// reads a single hash field; the status's own expiry is set once per
// statusTTLEvery, not at every write).
const statusWriteCommands = 6

// A fleet's Redis work beyond its status writes does not grow with its
// targets: three coordinators (interval 2 s, simulated probes) at 200
// targets and three at 1,000, each fleet on a redis-server of its own,
// both measured over the same 4 s at steady state (every lease held once
// by the member the fleet gives it to, every target written since).
// Redis counts every command, those scripts make too; a status write (at
// most one per target per interval, the fleet's M/T; one per rewrite
// period for a target whose verdict does not change) costs a fixed number
// of them, and a lease extended between a command; the rest is
// heartbeats, leases taken, echo markers and reads of stored statuses,
// which must be as many a second per instance at 1,000 targets as at
// 200. All of it stays under 3 x M/T. (Reading every status every 10 s, as the fleet did, made
// them about 42/s and 176/s; 2,000 targets are too many for a -race run
// on a loaded machine of two cores.)
//
// A window in which an instance went local, took or released a lease,
// read every status or read a holder's statuses after a gap is not the
// steady state, and is measured again: a machine loaded enough to make a
// Redis call miss its deadlines for two cycles or a heartbeat come too
// late makes those, at their cost, which grows with the targets.
// TestFeedLateMessageNoGap shows that a message merely late costs
// nothing.
func TestFeedCommandsFlatInTargets(t *testing.T) {
	if testing.Short() {
		t.Skip("measures for 4 s or more")
	}
	const n, interval, window, tries = 3, 2 * time.Second, 4 * time.Second, 3
	sizes := []int{200, 1000}
	type fleet struct {
		admin *redis.Client
		ins   []*feedInstance
		// measured in the last window
		before, after     map[string]int64
		writes, upsets    int64
		gapReads, writes0 int64
		extended          int64 // leases extended without a write
	}
	fleets := map[int]*fleet{}
	for _, m := range sizes {
		srv := redistest.Start(t)
		f := &fleet{admin: srv.Client(t)}
		targets := feedTargets(m)
		for range n {
			f.ins = append(f.ins, startFeedInstance(t, srv, targets, Config{Prefix: "sim:", Interval: interval, Timeout: interval / 4, Logf: t.Logf}))
		}
		fleets[m] = f
	}
	settled := func(m int) func() bool {
		ins := fleets[m].ins
		return func() bool {
			total := 0
			for _, in := range ins {
				c := in.coord
				c.mu.Lock()
				mine := 0
				for _, o := range c.owners {
					if o == c.Token() {
						mine++
					}
				}
				members, held := len(c.memberList), len(c.held)
				c.mu.Unlock()
				if members != n || held != mine {
					return false
				}
				total += held
			}
			return total == m
		}
	}
	for _, m := range sizes {
		if !within(60*time.Second, settled(m)) {
			t.Skipf("%d targets: not every one of the leases held once, by the member the fleet of %d gives it to, after 60 s: this machine is too loaded to reach the steady state", m, n)
		}
	}
	// Steady state: every target written again since its lease was
	// taken (the takes' first probes and writes are behind).
	for _, m := range sizes {
		ins := fleets[m].ins
		w := feedWritesOf(ins)
		eventually(t, 30*time.Second, fmt.Sprintf("%d more status writes", m), func() bool { return feedWritesOf(ins) >= w+int64(m) })
	}
	quiet := false
	for try := 1; try <= tries && !quiet; try++ {
		for _, m := range sizes {
			f := fleets[m]
			f.upsets, f.gapReads, f.extended = -feedUpsets(f.ins), -feedGapReads(f.ins), -feedExtensions(f.ins)
			f.before, f.writes0 = redisCalls(t, f.admin), feedWritesOf(f.ins)
		}
		time.Sleep(window) // a measurement window, not a synchronisation
		quiet = true
		for _, m := range sizes {
			f := fleets[m]
			f.after, f.writes = redisCalls(t, f.admin), feedWritesOf(f.ins)-f.writes0
			f.upsets += feedUpsets(f.ins)
			f.gapReads += feedGapReads(f.ins)
			f.extended += feedExtensions(f.ins)
			if f.upsets != 0 || f.gapReads != 0 {
				quiet = false
				t.Logf("%d targets, window %d: %d switches to local mode, changes of the leases held and reads of every status, %d reads of a holder's statuses after a gap (a loaded machine): not the steady state, measuring again", m, try, f.upsets, f.gapReads)
			}
		}
	}
	if !quiet {
		t.Skipf("no window of %v in %d without an instance going local, its leases changing or reading statuses again: this machine is too loaded to measure the steady state", window, tries)
	}
	perInstance := map[int]float64{}
	secs := window.Seconds()
	for _, m := range sizes {
		f := fleets[m]
		delete(f.after, "info")
		total, writes := int64(0), f.after["hget"]-f.before["hget"]
		var table []string
		for _, name := range slices.Sorted(maps.Keys(f.after)) {
			if d := f.after[name] - f.before[name]; d > 0 {
				total += d
				table = append(table, fmt.Sprintf("%s %.1f", name, float64(d)/secs))
			}
		}
		rest := float64(total-statusWriteCommands*writes-f.extended) / secs / n
		perInstance[m] = rest
		mt := float64(m) / interval.Seconds()
		t.Logf("%d instances x %d targets, interval %v: %.0f Redis commands/s (%.2f x M/T = %.0f; scripts' included), %.0f status writes/s (%d seen fenced in), %.0f leases extended/s, %.1f commands/s per instance beyond the status writes and extensions",
			n, m, interval, float64(total)/secs, float64(total)/secs/mt, mt, float64(writes)/secs, f.writes, float64(f.extended)/secs, rest)
		t.Logf("commands/s by name: %s", strings.Join(table, ", "))
		// A target whose verdict does not change is not written at every
		// probe: its status is rewritten every rewrite period, its lease
		// extended between (the promise the fleet follows is M/T writes;
		// at a write per probe, a status write's seven commands made it
		// about 7 x M/T).
		if got := float64(total) / secs / mt; m == sizes[len(sizes)-1] && got > 3 {
			t.Errorf("%d targets: %.0f Redis commands/s, %.2f x M/T: over 3 x M/T", m, float64(total)/secs, got)
		}
	}
	if perInstance[1000] > 1.5*perInstance[200]+5 {
		t.Errorf("Redis commands per instance beyond the status writes: %.1f/s at 1,000 targets, %.1f/s at 200: they grow with the targets",
			perInstance[1000], perInstance[200])
	}
}

// within reports whether cond held within d.
func within(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

func feedUpsets(ins []*feedInstance) int64 {
	var n int64
	for _, in := range ins {
		n += in.upsets.Load()
	}
	return n
}

func feedGapReads(ins []*feedInstance) int64 {
	var n int64
	for _, in := range ins {
		n += in.coord.gapReads.Load()
	}
	return n
}

func feedExtensions(ins []*feedInstance) int64 {
	var n int64
	for _, in := range ins {
		n += in.coord.extensions.Load()
	}
	return n
}

func feedWritesOf(ins []*feedInstance) int64 {
	var n int64
	for _, in := range ins {
		n += in.writes.Load()
	}
	return n
}

// deafness makes a coordinator's subscription lose the messages of a key
// while it is on, as a subscription that missed them would: neither
// heard (their publish numbers) nor applied; or, with late set, hear and
// apply them that late, as a subscriber on a loaded machine would.
type deafness struct {
	key     string
	late    time.Duration
	on      atomic.Bool
	dropped atomic.Int64
}

func (d *deafness) install(c *Coordinator) {
	heard, accept := c.sub.Heard, c.sub.Accept
	deaf := func(key string) bool {
		if !d.on.Load() || key != d.key {
			return false
		}
		if d.late > 0 {
			time.Sleep(d.late) // the fault: this subscriber is behind
			return false
		}
		return true
	}
	c.sub.Heard = func(key string, v int64, b []byte) {
		if !deaf(key) {
			heard(key, v, b)
		}
	}
	c.sub.Accept = func(key string, v int64, b []byte) bool {
		if deaf(key) {
			d.dropped.Add(1)
			return false
		}
		return accept(key, v, b)
	}
}

// resyncCounter is an Observer that counts the reads of every status.
type resyncCounter struct{ n *atomic.Int64 }

func (r resyncCounter) Mode(string)               {}
func (r resyncCounter) Leases(int)                {}
func (r resyncCounter) Message(string)            {}
func (r resyncCounter) Propagation(time.Duration) {}
func (r resyncCounter) Extend(int, int)           {}
func (r resyncCounter) Write(bool, bool)          {}
func (r resyncCounter) Resync(error)              { r.n.Add(1) }

// Settings of the gap tests: an interval of a second, so that the handoff
// a holder's statuses keep covering for while a gap is repaired (an
// interval, a probe and a cycle: 2 s) leaves the read that repairs it
// time to spare on a loaded machine.
const (
	gapInterval = time.Second
	gapTimeout  = 500 * time.Millisecond
)

// gapPair is two instances checking one backend, the holder (tx) and the
// other (rx), whose subscription to the backend's key deaf disturbs once
// on.
type gapPair struct {
	b      *backend
	tx, rx *instance
	deaf   *deafness
	// rxProbes and rxFull count rx's probes and reads of every status
	// since the pair settled.
	rxProbes, rxFull func() int64
}

// startGapPair starts a gapPair whose rx hears the key's messages late
// (or never, late 0) once deaf is on, and waits until the lease is held
// by its owner alone, both see the backend up, and the holder's status
// covers it for rx (which held it first, maybe, when it was alone).
func startGapPair(t *testing.T, late time.Duration) *gapPair {
	t.Helper()
	srv := redistest.Start(t)
	p := &gapPair{b: newBackend(t)}
	targets := []health.Target{{Key: "c/a", Addr: p.b.addr}}
	var ins [2]*instance
	var deaf [2]*deafness
	var probes, full [2]atomic.Int64
	for i := range 2 {
		deaf[i] = &deafness{key: "c/a", late: late}
		cfg := Config{Prefix: "fleet:", Interval: gapInterval, Timeout: gapTimeout, Resync: time.Hour, Logf: t.Logf, Observer: resyncCounter{&full[i]}}
		hc := health.Config{Check: health.CheckTCP, Interval: gapInterval, Timeout: gapTimeout, Rise: 1, Fall: 1,
			Observe: func(string, string, time.Duration) { probes[i].Add(1) }}
		ins[i] = startCheckedWith(t, newClient(t, srv), targets, cfg, hc, deaf[i].install)
	}
	tokens := []string{ins[0].coord.Token(), ins[1].coord.Token()}
	slices.Sort(tokens)
	tx, rx := 0, 1
	if owner(tokens, "c/a") == ins[1].coord.Token() {
		tx, rx = 1, 0
	}
	p.tx, p.rx, p.deaf = ins[tx], ins[rx], deaf[rx]
	eventually(t, 10*time.Second, "the lease held by its owner alone, both see the backend up, the holder's status covers it for the other", func() bool {
		total, _ := totalHeld(ins[:])
		c := p.rx.coord
		c.mu.Lock()
		covered := c.covered("c/a", p.b.addr)
		c.mu.Unlock()
		return total == 1 && len(p.tx.coord.Held()) == 1 && covered && allState(ins[:], targets, health.Up)()
	})
	probed, read := probes[rx].Load(), full[rx].Load()
	p.rxProbes = func() int64 { return probes[rx].Load() - probed }
	p.rxFull = func() int64 { return full[rx].Load() - read }
	return p
}

// stopBackend stops the backend while rx's subscription is disturbed,
// and returns when the holder saw it down.
func (p *gapPair) stopBackend(t *testing.T) time.Time {
	t.Helper()
	p.deaf.on.Store(true)
	p.b.ln.Close()
	eventually(t, 10*time.Second, "the holder sees the backend down", func() bool { return p.tx.state("c/a") == health.Down })
	return time.Now()
}

// rxHasDown waits until rx applied the holder's down.
func (p *gapPair) rxHasDown(t *testing.T, within time.Duration) {
	t.Helper()
	holder := p.tx.coord.Token()
	c := p.rx.coord
	eventually(t, within, "the holder's down reaches the other instance", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		r := c.remote["c/a"]
		return r != nil && r.Holder == holder && r.State == "down"
	})
}

// A message lost (the holder's "down" after its backend stopped, never
// heard by the other instance, which reads no status again on a timer:
// Resync an hour) is found by the holder's watermark: its heartbeats say
// it published more than was heard, and once that stays so for two
// cycles and a Redis call (the gap rule) the other instance reads the
// holder's statuses again, applying its "down" without subscribing again
// or reading every status. Meanwhile the holder's statuses keep covering
// the backend for a handoff: the other instance does not probe it (every
// instance of a fleet probing a holder's targets at each gap would be a
// storm of its own making).
func TestFeedGapRepairedByWatermark(t *testing.T) {
	p := startGapPair(t, 0)
	c := p.rx.coord
	reads := c.gapReads.Load()
	published := p.stopBackend(t)
	// The holder's next heartbeat stores its watermark, the other's
	// next reads it, the gap rule waits (and for the next marker's echo
	// to come back), and the next heartbeat finds it.
	bound := c.b.gapAfter() + 3*c.b.cycle + echoEvery
	p.rxHasDown(t, bound+attackMargin+5*time.Second)
	took := time.Since(published)
	eventually(t, 5*time.Second, "the other instance's view says down", func() bool { return p.rx.state("c/a") == health.Down })
	t.Logf("the holder's down, its message lost, applied by the other instance %v after the holder saw it (bound %v: three cycles, the gap rule and a marker); %d messages lost, %d reads after a gap, %d probes of the backend by the other instance meanwhile",
		took.Round(time.Millisecond), bound, p.deaf.dropped.Load(), c.gapReads.Load()-reads, p.rxProbes())
	if p.deaf.dropped.Load() == 0 {
		t.Fatal("no message of the key was lost: the test shows nothing")
	}
	if c.gapReads.Load() == reads {
		t.Error("no read after a gap: the down came another way")
	}
	if n := p.rxFull(); n != 0 {
		t.Errorf("%d reads of every status meanwhile, want none: the gap alone must repair it", n)
	}
	if n := p.rxProbes(); n != 0 {
		t.Errorf("the other instance probed the backend %d times while the gap was repaired, want none: the holder's statuses cover it for a handoff (%v)", n, c.b.handoff())
	}
	if took > bound+attackMargin {
		t.Errorf("the lost down applied %v after the holder saw it, over %v", took, bound+attackMargin)
	}
}

// A message delivered late is not lost: the other instance's subscriber
// hears the holder's "down" 1.75 s late (three and a half cycles: a
// loaded machine),
// and applies it as it comes, without reading anything again: a
// watermark unreached for less than two cycles and a Redis call is no
// gap.
func TestFeedLateMessageNoGap(t *testing.T) {
	const late = 7 * gapInterval / 4
	p := startGapPair(t, late)
	c := p.rx.coord
	reads := c.gapReads.Load()
	published := p.stopBackend(t)
	p.rxHasDown(t, late+attackMargin+5*time.Second)
	took := time.Since(published)
	c.mu.Lock()
	f := c.feeds[p.tx.coord.Token()]
	pending := f != nil && f.pending != 0
	c.mu.Unlock()
	t.Logf("the holder's down, delivered %v late, applied by the other instance %v after the holder saw it; %d reads after a gap", late, took.Round(time.Millisecond), c.gapReads.Load()-reads)
	if n := c.gapReads.Load() - reads; n != 0 || pending {
		t.Errorf("%d reads after a gap (one pending: %v) for a message %v late, want none: late is not lost", n, pending, late)
	}
	if n := p.rxFull(); n != 0 {
		t.Errorf("%d reads of every status, want none", n)
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

// A member's watermark rewritten far ahead every 20 ms by someone without
// the secret is refused (unsigned: its member counts as one that stores
// none this time, logged once) and costs no read of anyone's statuses;
// without a secret, the forged watermark costs reads of that member's
// statuses, not the fleet's views: in both, a stopped backend leaves
// every view within the bound and a new instance never sees it up.
func TestFeedForgedWatermarks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		secret []byte
	}{{"secret", attackSecret}, {"no secret", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			f := startAttackFleet(t, 3, 3, tc.secret)
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			t.Cleanup(func() { stop(); wg.Wait() })
			var before int64
			var entries []string
			for _, in := range f.ins {
				before += in.coord.gapReads.Load()
				entries = append(entries, in.coord.leases.memberEntry())
			}
			wg.Go(func() {
				for ctx.Err() == nil {
					for _, e := range entries {
						f.raw.HSet(ctx, watermarksKey("fleet:"), e, "999999999999")
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
			took := f.leaves(t, 0)
			f.newcomer(t, 0)
			var reads int64
			for _, in := range f.ins[:3] {
				reads += in.coord.gapReads.Load()
			}
			reads -= before
			t.Logf("watermarks forged every 20 ms: backend gone from every view in %v (bound %v), %d reads of a member's statuses after a gap", took.Round(time.Millisecond), attackBound, reads)
			if tc.secret != nil {
				if reads != 0 {
					t.Errorf("%d reads after a gap for unsigned watermarks, want none: they must not count", reads)
				}
				f.quietLogs(t, "watermark ignored")
			}
		})
	}
}
