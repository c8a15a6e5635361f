package lock

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
)

// A member that joins and takes nothing for a while (a new instance on a
// loaded machine, tens of seconds into its start; or, without a secret, a
// member anyone added) moves keys to itself without uncovering them: their
// holders keep their leases and go on probing them, writing and publishing
// each verdict, so each such backend is still probed by one instance, not
// by every instance once a handoff has passed; a backend among them that
// stops leaves every view within the checks' bound; and a real instance
// that joins takes its keys over from their holders at its first round,
// without waiting out a lease to seize them.
func TestHandoverToMemberThatTakesNothing(t *testing.T) {
	f := startAttackFleet(t, 2, 12, nil)
	ctx := context.Background()
	slow := "slowjoiner"
	actx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for actx.Err() == nil {
			until := float64(time.Now().Add(800 * time.Millisecond).UnixMilli())
			f.raw.ZAdd(actx, membersKey("fleet:"), redis.Z{Score: until, Member: slow})
			time.Sleep(50 * time.Millisecond)
		}
	})
	t.Cleanup(func() { stop(); wg.Wait() })

	tokens := []string{slow}
	for _, in := range f.ins {
		tokens = append(tokens, in.coord.Token())
	}
	slices.Sort(tokens)
	var moved []int
	for i, tg := range f.targets {
		if owner(tokens, tg.Key) == slow {
			moved = append(moved, i)
		}
	}
	if len(moved) == 0 {
		t.Fatalf("no key of %d moves to the added member: pick more backends", len(f.targets))
	}
	eventually(t, 5*time.Second, "every instance counts the added member", func() bool {
		for _, in := range f.ins {
			if in.coord.Members() != len(tokens) {
				return false
			}
		}
		return true
	})

	// Past a few handoffs, the keys that moved are still held, each by
	// one instance, and probed by it alone.
	b := f.ins[0].coord.b
	settle := time.Now().Add(3 * b.handoff())
	for time.Now().Before(settle) {
		time.Sleep(10 * time.Millisecond)
	}
	before := make([]int64, len(moved))
	for j, i := range moved {
		before[j] = f.backends[i].accepted.Load()
	}
	window := 30 * fleetInterval
	measured := time.Now()
	for time.Since(measured) < window {
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(measured)
	var probes int64
	for j, i := range moved {
		probes += f.backends[i].accepted.Load() - before[j]
	}
	perInterval := float64(probes) / float64(len(moved)) / (float64(elapsed) / float64(fleetInterval))
	t.Logf("%d of %d keys moved to a member that takes nothing: %.2f probes per backend per interval over %v (two instances)", len(moved), len(f.targets), perInterval, elapsed.Round(time.Millisecond))
	if perInterval > 1.5 {
		t.Errorf("the keys moved to a member that takes nothing are probed %.2f times per interval, want about one (their holder alone)", perInterval)
	}
	if total, _ := totalHeld(f.ins); total != len(f.targets) {
		t.Errorf("the instances hold %d leases, want all %d: a holder keeps a key until its new owner takes it", total, len(f.targets))
	}

	took := f.leaves(t, moved[0])
	t.Logf("backend %d (its key moved to the member that takes nothing) stopped: gone from every view in %v (bound %v)", moved[0], took.Round(time.Millisecond), attackBound)

	// A real instance joins: it takes its keys over from their holders.
	stop()
	wg.Wait()
	f.raw.ZRem(ctx, membersKey("fleet:"), slow)
	in := f.start(t)
	joined := time.Now()
	eventually(t, 5*time.Second, "the new instance holds the keys the fleet gives it, and no one else does", func() bool {
		return f.settled()
	})
	t.Logf("the new instance took its %d keys over within %v of its start", len(in.coord.Held()), time.Since(joined).Round(time.Millisecond))
	for i, l := range f.logs {
		if n := l.count("kept from this instance"); n > 0 {
			t.Errorf("instance %d seized %d leases: a holder hands a key over when its new owner takes it", i, n)
		}
	}
	if !allState(f.ins, f.targets[moved[0]:moved[0]+1], health.Down)() {
		t.Errorf("the stopped backend %d is not down in every view after the new instance joined", moved[0])
	}
}

// A member that takes a key over from a holder that was probing it writes
// that holder's last verdict, with its counters, as its own at once: the
// fleet goes on answering from the key's owner however late the new
// member's checker comes to the key (here never: it has none), instead of
// the old holder's status lapsing a handover later and every instance
// probing the key meanwhile.
func TestHandoverWritesLastVerdict(t *testing.T) {
	f := startAttackFleet(t, 2, 12, nil)
	coord, err := NewCoordinator(newClient(t, f.srv), Config{Prefix: "fleet:", Interval: fleetInterval, Timeout: fleetTimeout, Resync: time.Second, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	coord.SetProbeNow(func(string) {})
	coord.SetProbeAtPhase(func(string) {})
	coord.SetTargets(f.targets)
	joiner := runInstance(t, coord, nil)
	tokens := []string{joiner.coord.Token()}
	for _, in := range f.ins {
		tokens = append(tokens, in.coord.Token())
	}
	slices.Sort(tokens)
	var mine []health.Target
	for _, tg := range f.targets {
		if owner(tokens, tg.Key) == joiner.coord.Token() {
			mine = append(mine, tg)
		}
	}
	if len(mine) == 0 {
		t.Fatalf("no key of %d goes to the new member: pick more backends", len(f.targets))
	}
	eventually(t, 5*time.Second, "the new member holds its keys and the others' Views show its statuses", func() bool {
		if len(joiner.coord.Held()) != len(mine) {
			return false
		}
		for _, in := range f.ins {
			in.coord.mu.Lock()
			for _, tg := range mine {
				if r, ok := in.coord.remote[tg.Key]; !ok || r.Holder != joiner.coord.Token() || r.progress().Verdict.State != health.Up {
					in.coord.mu.Unlock()
					return false
				}
			}
			in.coord.mu.Unlock()
		}
		return true
	})
	// Past a few handovers, nobody probes the keys the new member took
	// (its checker never does), and the fleet still answers them Up. (The
	// old holder's probe of the next interval is its last: its write
	// then finds the lease taken.)
	b := f.ins[0].coord.b
	for settle := time.Now().Add(2 * fleetInterval); time.Now().Before(settle); {
		time.Sleep(10 * time.Millisecond)
	}
	before := make([]int64, len(mine))
	idx := map[string]int{}
	for i, tg := range f.targets {
		idx[tg.Key] = i
	}
	for j, tg := range mine {
		before[j] = f.backends[idx[tg.Key]].accepted.Load()
	}
	end := time.Now().Add(3 * b.handover())
	for time.Now().Before(end) {
		time.Sleep(10 * time.Millisecond)
	}
	for j, tg := range mine {
		if n := f.backends[idx[tg.Key]].accepted.Load() - before[j]; n > 0 {
			t.Errorf("%s, taken over by a member whose checker is late, was probed %d times by the others in %v: its owner's status covers it", tg.Key, n, 3*b.handover())
		}
	}
	if !allState(f.ins, mine, health.Up)() {
		t.Errorf("the keys taken over are not Up in every View")
	}
}
