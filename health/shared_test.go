package health

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// sharing is a Shared that probes while mine is set, seeding from seed, and
// keeps what it is told.
type sharing struct {
	mu       sync.Mutex
	mine     bool
	seed     Progress
	claims   int
	recorded []Progress
}

func (s *sharing) Claim(Target) (bool, Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.claims++
	return s.mine, s.seed
}

func (s *sharing) Record(_ Target, p Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recorded = append(s.recorded, p)
}

func (s *sharing) set(mine bool, seed Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mine, s.seed = mine, seed
}

func (s *sharing) counts() (claims, records int, last Progress) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.recorded); n > 0 {
		last = s.recorded[n-1]
	}
	return s.claims, len(s.recorded), last
}

// With Shared, a target that is not claimed is not probed (not one
// connection reaches it); claimed, it continues from the seed, so one
// success completes a rise the seed had two thirds of; every probe's
// progress is recorded, its counters bounded by rise and fall; ProbeNow
// probes at once instead of at the next tick.
func TestSharedClaimSeedRecord(t *testing.T) {
	const interval = 100 * time.Millisecond
	sh := &sharing{}
	c := mustNew(t, Config{Check: CheckTCP, Interval: interval, Timeout: 50 * time.Millisecond, Rise: 3, Fall: 2, Shared: sh})
	srv := listenReply(t, "127.0.0.1:0", []byte{})
	c.SetTargets([]Target{{Key: "c/a", Addr: srv.addr}})
	start(t, c, 0)

	// Not ours: claimed several times, never probed.
	if err := pgtest.WaitFor(3*time.Second, func() error {
		if n, _, _ := sh.counts(); n < 4 {
			return fmt.Errorf("%d claims", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n := srv.accepted.Load(); n != 0 {
		t.Fatalf("%d probes reached a target another checker holds, want 0", n)
	}

	// Ours from a seed two successes into a rise of 3: one probe makes it Up.
	sh.set(true, Progress{OK: 2})
	c.ProbeNow("c/a")
	if err := pgtest.WaitFor(3*time.Second, func() error {
		if _, n, _ := sh.counts(); n < 1 {
			return fmt.Errorf("no probe recorded")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	_, _, p := sh.counts()
	if p.Verdict.State != Up || p.OK != 3 || p.Fail != 0 {
		t.Fatalf("first probe after a seed of OK=2 (rise 3): %+v, want Up with OK=3", p)
	}
	// More successes keep OK at rise.
	if err := pgtest.WaitFor(3*time.Second, func() error {
		if _, n, _ := sh.counts(); n < 3 {
			return fmt.Errorf("%d probes recorded", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, _, p := sh.counts(); p.OK != 3 {
		t.Fatalf("OK after several successes with rise 3: %d, want it bounded at 3", p.OK)
	}
}

// ProbeNow probes a target whose next tick is far off at once.
func TestProbeNow(t *testing.T) {
	c := mustNew(t, Config{Check: CheckTCP, Interval: time.Hour, Timeout: 50 * time.Millisecond, Rise: 1, Fall: 1})
	srv := listenReply(t, "127.0.0.1:0", []byte{})
	c.SetTargets([]Target{{Key: "c/a", Addr: srv.addr}})
	start(t, c, 0)
	// The first tick is at a random point of the hour: ask for it now, and
	// again once it ran (a second ProbeNow must start a second probe).
	for want := int32(1); want <= 2; want++ {
		if err := pgtest.WaitFor(3*time.Second, func() error {
			c.ProbeNow("c/a")
			if n := srv.accepted.Load(); n < want {
				return fmt.Errorf("%d probes, want %d", n, want)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	c.ProbeNow("c/none") // not a target: nothing happens
}
