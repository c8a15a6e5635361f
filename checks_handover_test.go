package pgcluster

import (
	"context"
	"maps"
	"net/netip"
	"reflect"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// viewLog records the Views a handover publishes (from its lapse timer
// too).
type viewLog struct {
	mu    sync.Mutex
	views []health.View
}

func (l *viewLog) publish(v health.View) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.views = append(l.views, v)
}

func (l *viewLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.views)
}

func (l *viewLog) last(t *testing.T) health.View {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.views) == 0 {
		t.Fatal("nothing published")
	}
	return l.views[len(l.views)-1]
}

// TestHandover: the instance a reload starts publishes its predecessor's
// verdicts at once; each stands in for a node its own View does not judge
// yet, at the same address, until its own View judges the node or
// carryFor passes; the registration ends with the last instance.
func TestHandover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const key = "registry\x00zone\x00tcp\x00"
		a := netip.MustParseAddrPort("192.0.2.1:5432")
		b := netip.MustParseAddrPort("192.0.2.2:5432")
		moved := netip.MustParseAddrPort("192.0.2.3:5432")

		// The first instance has no predecessor: it publishes only its own.
		ctx1, cancel1 := context.WithCancel(t.Context())
		var log1 viewLog
		h1 := newHandover(key)
		h1.start(ctx1, log1.publish, time.Second)
		if n := log1.count(); n != 0 {
			t.Fatalf("published %d Views without a predecessor", n)
		}
		h1.setTargets([]health.Target{{Key: "c/a", Addr: a}, {Key: "c/b", Addr: b}})
		h1.setView(health.ViewOf(map[string]health.Verdict{"c/a": down("refused"), "c/b": up("", 0)}))

		// Its successor publishes those verdicts at once.
		ctx2, cancel2 := context.WithCancel(t.Context())
		var log2 viewLog
		h2 := newHandover(key)
		h2.start(ctx2, log2.publish, time.Second)
		if got, want := log2.last(t), map[string]health.Verdict{"c/a": down("refused"), "c/b": up("", 0)}; !reflect.DeepEqual(maps.Collect(got.All()), want) {
			t.Fatalf("at start: %v, want %v", got, want)
		}
		cancel1() // the predecessor stops after its successor started
		// A node whose address changed does not keep the old verdict:
		// it is published again without it at once.
		h2.setTargets([]health.Target{{Key: "c/a", Addr: a}, {Key: "c/b", Addr: moved}})
		synctest.Wait()
		if got, want := log2.last(t), map[string]health.Verdict{"c/a": down("refused")}; !reflect.DeepEqual(maps.Collect(got.All()), want) {
			t.Fatalf("after c/b moved: %v, want %v", got, want)
		}
		h2.setView(health.View{})
		if got, want := log2.last(t), map[string]health.Verdict{"c/a": down("refused")}; !reflect.DeepEqual(maps.Collect(got.All()), want) {
			t.Fatalf("first own View, empty: %v, want %v", got, want)
		}
		// Its own verdict replaces the carried one for good.
		h2.setView(health.ViewOf(map[string]health.Verdict{"c/a": up("", 0)}))
		h2.setView(health.View{})
		if got := log2.last(t); got.Len() != 0 {
			t.Fatalf("a carried verdict came back after an own one: %v", got)
		}

		// A third instance carries the second's; after carryFor its own
		// View is published alone.
		h2.setView(health.ViewOf(map[string]health.Verdict{"c/a": down("timeout")}))
		ctx3, cancel3 := context.WithCancel(t.Context())
		var log3 viewLog
		h3 := newHandover(key)
		h3.start(ctx3, log3.publish, time.Second)
		h3.setTargets([]health.Target{{Key: "c/a", Addr: a}, {Key: "c/b", Addr: moved}})
		h3.setView(health.ViewOf(map[string]health.Verdict{"c/b": up("", 0)}))
		if got, want := log3.last(t), map[string]health.Verdict{"c/a": down("timeout"), "c/b": up("", 0)}; !reflect.DeepEqual(maps.Collect(got.All()), want) {
			t.Fatalf("carried and own: %v, want %v", got, want)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if got, want := log3.last(t), map[string]health.Verdict{"c/b": up("", 0)}; !reflect.DeepEqual(maps.Collect(got.All()), want) {
			t.Fatalf("after carryFor: %v, want %v", got, want)
		}

		cancel2()
		synctest.Wait()
		handovers.Lock()
		if handovers.m[key] != h3 {
			t.Errorf("a stopped predecessor unregistered its successor")
		}
		handovers.Unlock()
		cancel3()
		synctest.Wait()
		handovers.Lock()
		defer handovers.Unlock()
		if _, ok := handovers.m[key]; ok {
			t.Errorf("the last instance stopped and its verdicts are still kept")
		}
	})
}

// TestCarryFor: long enough for the checks to judge every node after a
// Redis call timed out.
func TestCarryFor(t *testing.T) {
	cfg := &settings{interval: 500 * time.Millisecond, timeout: 200 * time.Millisecond, rise: 2, fall: 3}
	if got, want := carryFor(cfg), 500*time.Millisecond+5*500*time.Millisecond+200*time.Millisecond; got != want {
		t.Errorf("carryFor = %v, want %v", got, want)
	}
}
