package health

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// A timeout this process saw late (it ran the probe long after its
// deadline, starved of CPU) is not judged: the node's verdict stands for
// up to Fall of them in a row, and the ones after count, so that a node
// that stops answering still leaves within twice its Fall probes on a
// starved machine. A timeout seen in time counts at once, as before. In a
// bubble's time, with a probe that stands for the process: it answers, or
// times out and returns a Timeout late, or on time.
func TestLateTimeoutNotJudged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const interval, timeout = time.Second, 100 * time.Millisecond
		var mode atomic.Int32 // 0: answers; 1: times out, seen late; 2: times out, seen on time
		var mu sync.Mutex
		var causes []string
		c := mustNew(t, Config{Check: CheckTCP, Interval: interval, Timeout: timeout, Rise: 1, Fall: 2,
			Observe: func(_, cause string, _ time.Duration) {
				mu.Lock()
				defer mu.Unlock()
				causes = append(causes, cause)
			}})
		// Late or on time by the stand-in's timing alone: the real
		// process's scheduling (a loaded machine running other tests)
		// must not make a timeout that ends on time in the bubble late.
		c.starved = func(time.Time) bool { return false }
		c.probe = func(ctx context.Context, _ netip.AddrPort) result {
			switch mode.Load() {
			case 0:
				return result{cause: CauseOK}
			case 1:
				<-ctx.Done()
				time.Sleep(timeout) // the process ran again only now
			default:
				<-ctx.Done()
			}
			return failure(CauseTimeout, ctx.Err())
		}
		c.SetTargets([]Target{{Key: "c/n", Addr: netip.MustParseAddrPort("127.0.0.1:1")}})
		rec, stop := start(t, c, 0)
		defer stop()
		// probes waits for n more probes and returns their causes, and
		// the node's state in the View published after them.
		seen := 0
		probes := func(n int) ([]string, State) {
			t.Helper()
			for deadline := time.Now().Add(time.Duration(n+1) * interval); ; time.Sleep(10 * time.Millisecond) {
				mu.Lock()
				got := slices.Clone(causes)
				mu.Unlock()
				if len(got) >= seen+n {
					seen += n
					time.Sleep(interval / 4) // the View after them (coalesced)
					synctest.Wait()
					v, _ := rec.last()
					return got[seen-n : seen], v.At("c/n").State
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d probes within %v, want %d", len(got)-seen, time.Duration(n+1)*interval, n)
				}
			}
		}
		// Two probes: the first comes at once, the second at the
		// target's phase, then every Interval (the checks below come a
		// quarter of one after a probe).
		if got, st := probes(2); !slices.Equal(got, []string{CauseOK, CauseOK}) || st != Up {
			t.Fatalf("answering: %v, %v; want [ok ok], Up", got, st)
		}
		mode.Store(1)
		if got, st := probes(2); !slices.Equal(got, []string{CauseLate, CauseLate}) || st != Up {
			t.Fatalf("two timeouts seen late (Fall 2): %v, %v; want [late late], still Up", got, st)
		}
		if got, st := probes(2); !slices.Equal(got, []string{CauseTimeout, CauseTimeout}) || st != Down {
			t.Fatalf("two more timeouts seen late: %v, %v; want them judged, Down", got, st)
		}
		mode.Store(0)
		if got, st := probes(1); !slices.Equal(got, []string{CauseOK}) || st != Up {
			t.Fatalf("answering again: %v, %v; want [ok], Up", got, st)
		}
		mode.Store(2)
		if got, st := probes(2); !slices.Equal(got, []string{CauseTimeout, CauseTimeout}) || st != Down {
			t.Fatalf("two timeouts seen on time: %v, %v; want them judged, Down", got, st)
		}
	})
}
