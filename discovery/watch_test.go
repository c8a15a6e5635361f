package discovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
)

// watch starts a Watcher on name whose events go to the returned channel.
func watch(t *testing.T, cl *Client, name string, opts WatchOptions) (*Watcher, events) {
	t.Helper()
	ev := newEvents()
	opts.OnEvent = ev.on
	w, err := cl.Watch(t.Context(), name, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w, ev
}

func TestWatchInitialEvents(t *testing.T) {
	c := newCluster(t, 0, 0)
	w, ev := watch(t, c.client(t, Config{}), "prod.pgcluster.lan", WatchOptions{})
	for _, n := range c.nodes {
		ev.await(t, 5*time.Second, isEvent(Added, n.Addr, false))
	}
	e, _ := ev.await(t, 5*time.Second, isEvent(Added, c.nodes[0].Addr, true))
	if e.Reason != ReasonInitial {
		t.Errorf("reason %s, want initial", e.Reason)
	}
	if got := len(w.Candidates()); got != 2 {
		t.Errorf("%d candidates, want 2", got)
	}
	if p := w.Primary(); len(p) != 1 || p[0].Addr != c.nodes[0].Addr {
		t.Errorf("primary %v, want %s", p, c.nodes[0].Addr)
	}
}

// The TTL runs out: a node removed shows within TTL + 1 s, one added too.
func TestWatchTTL(t *testing.T) {
	c := newCluster(t, 0, 0, 0)
	c.dns.SetTTL(1)
	w, ev := watch(t, c.client(t, Config{}), "local.pgcluster.lan", WatchOptions{Interval: time.Hour, IgnorePrimary: true})

	gone := c.nodes[2]
	c.nodes = c.nodes[:2]
	c.publish()
	e, took := ev.await(t, 10*time.Second, isEvent(Removed, gone.Addr, false))
	t.Logf("removal seen after %s (TTL 1s), reason %s", took, e.Reason)
	if e.Reason != ReasonTTL {
		t.Errorf("reason %s, want ttl", e.Reason)
	}
	if w.Contains(gone.Addr) {
		t.Error("the removed node is still a candidate")
	}

	pg := discoverytest.NewPostgres(t)
	c.nodes = append(c.nodes, discoverytest.Node{Name: "n9", Addr: pg.Addr})
	c.publish()
	_, took = ev.await(t, 10*time.Second, isEvent(Added, pg.Addr, false))
	t.Logf("addition seen after %s", took)
}

func TestWatchTimer(t *testing.T) {
	c := newCluster(t, 0, 0)
	c.dns.SetTTL(3600)
	_, ev := watch(t, c.client(t, Config{}), "local.pgcluster.lan",
		WatchOptions{Interval: 200 * time.Millisecond, MinInterval: MinWatchInterval})
	gone := c.nodes[1]
	c.nodes = c.nodes[:1]
	c.publish()
	e, _ := ev.await(t, 10*time.Second, isEvent(Removed, gone.Addr, false))
	if e.Reason != ReasonTimer {
		t.Errorf("reason %s, want timer", e.Reason)
	}
}

func TestWatchReportError(t *testing.T) {
	c := newCluster(t, 0, 0)
	c.dns.SetTTL(3600)
	w, ev := watch(t, c.client(t, Config{}), "local.pgcluster.lan",
		WatchOptions{Interval: time.Hour, MinInterval: MinWatchInterval})
	gone := c.nodes[1]
	c.nodes = c.nodes[:1]
	c.publish()
	w.ReportError(nil) // ignored
	w.ReportError(errors.New("connection refused"))
	e, took := ev.await(t, 10*time.Second, isEvent(Removed, gone.Addr, false))
	t.Logf("re-resolved %s after the error report", took)
	if e.Reason != ReasonError {
		t.Errorf("reason %s, want error", e.Reason)
	}
}

// After a read-only error (SQLSTATE 25006: the primary was demoted),
// LookupFunc waits for the resolution the error asked for instead of
// sending a new connection back to the old primary; after another error it
// does not wait (a probe round tells which nodes answer).
func TestWatcherLookupFuncAfterReadOnly(t *testing.T) {
	c := newCluster(t, 0, 0)
	c.dns.SetTTL(3600)
	w, _ := watch(t, c.client(t, Config{}), "primary.local.pgcluster.lan",
		WatchOptions{Interval: time.Hour, MinInterval: time.Second})
	lookup := w.LookupFunc()
	old, next := c.nodes[0].Addr.String(), c.nodes[1].Addr.String()

	// The switch, unseen until the Watcher resolves again.
	c.nodes[0].Role, c.nodes[1].Role = "standby", "primary"
	c.publish()
	w.ReportError(errors.New("connection reset"))
	if got, err := lookup(t.Context(), "primary.local.pgcluster.lan"); err != nil || len(got) != 1 || got[0] != old {
		t.Fatalf("after a connection error: %v, %v; want %s at once (MinInterval 1s holds the resolution back)", got, err, old)
	}
	start := time.Now()
	w.ReportError(fmt.Errorf("write: %w", &pgconn.PgError{Code: "25006"}))
	got, err := lookup(t.Context(), "primary.local.pgcluster.lan")
	if err != nil || len(got) != 1 || got[0] != next {
		t.Fatalf("after a read-only error: %v, %v; want the new primary %s", got, err, next)
	}
	t.Logf("the lookup waited %s for the resolution (MinInterval 1s)", time.Since(start))

	// A lookup whose context ends while it waits gives up.
	w.ReportError(&pgconn.PgError{Code: "25006"})
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := lookup(ctx, "primary.local.pgcluster.lan"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("lookup with a short deadline while waiting: %v, want the deadline", err)
	}
}

// The primary's answer changes: the watched name is resolved again at once,
// long before its own TTL.
func TestWatchPrimaryChangeTriggersResolve(t *testing.T) {
	c := newCluster(t, 0, 0, 0)
	c.dns.SetTTL(3600)
	c.dns.SetRecords("leader 1 IN A 127.0.0.1")
	_, ev := watch(t, c.client(t, Config{}), "local.pgcluster.lan",
		WatchOptions{Interval: time.Hour, MinInterval: MinWatchInterval, Primary: "leader.pgcluster.lan"})

	gone := c.nodes[2]
	c.nodes = c.nodes[:2]
	c.publish()
	c.dns.SetRecords("leader 1 IN A 127.0.0.2")
	e, took := ev.await(t, 10*time.Second, isEvent(Removed, gone.Addr, false))
	t.Logf("re-resolved %s after the primary switched (TTL 3600s)", took)
	if e.Reason != ReasonPrimary {
		t.Errorf("reason %s, want primary", e.Reason)
	}
}

func TestWatchPrimarySwitch(t *testing.T) {
	c := newCluster(t, 0, 0)
	c.dns.SetTTL(1)
	w, ev := watch(t, c.client(t, Config{}), "prod.pgcluster.lan", WatchOptions{})
	c.nodes[0].Role, c.nodes[1].Role = "standby", "primary"
	c.publish()
	ev.await(t, 10*time.Second, isEvent(Removed, c.nodes[0].Addr, true))
	ev.await(t, 10*time.Second, isEvent(Added, c.nodes[1].Addr, true))
	if p := w.Primary(); len(p) != 1 || p[0].Addr != c.nodes[1].Addr {
		t.Errorf("primary %v, want %s", p, c.nodes[1].Addr)
	}
	if len(w.Candidates()) != 2 {
		t.Errorf("candidates %v, want both nodes", w.Candidates())
	}
}

// While DNS is down the last answer stays; once it is back, changes flow.
func TestWatchDNSDown(t *testing.T) {
	c := newCluster(t, 0, 0)
	c.dns.SetTTL(1)
	errs := make(chan error, 100)
	ev := newEvents()
	cl := c.client(t, Config{DNSTimeout: 100 * time.Millisecond})
	w, err := cl.Watch(t.Context(), "local.pgcluster.lan", WatchOptions{
		MinInterval: MinWatchInterval, IgnorePrimary: true,
		OnEvent: ev.on,
		OnError: func(err error) {
			select {
			case errs <- err:
			default:
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()

	c.dns.Stop()
	select {
	case <-errs:
	case <-time.After(10 * time.Second):
		t.Fatal("no resolution error reported while DNS is down")
	}
	if len(w.Candidates()) != 2 {
		t.Fatalf("candidates %v while DNS is down, want the last answer", w.Candidates())
	}
	gone := c.nodes[1]
	c.nodes = c.nodes[:1]
	c.publish()
	c.dns.Start()
	_, took := ev.await(t, 15*time.Second, isEvent(Removed, gone.Addr, false))
	t.Logf("change seen %s after DNS came back", took)
}

func TestWatchStartsEmpty(t *testing.T) {
	c := newCluster(t)
	c.dns.SetTTL(1)
	w, ev := watch(t, c.client(t, Config{}), "local.pgcluster.lan", WatchOptions{IgnorePrimary: true})
	if len(w.Candidates()) != 0 {
		t.Fatalf("candidates %v, want none", w.Candidates())
	}
	if _, err := w.Rank(t.Context()); !errors.Is(err, ErrNoAddress) {
		t.Errorf("Rank with no candidate: %v, want ErrNoAddress", err)
	}
	pg := discoverytest.NewPostgres(t)
	c.dns.SetCluster("local", discoverytest.Node{Name: "n1", Addr: pg.Addr})
	ev.await(t, 10*time.Second, isEvent(Added, pg.Addr, false))
}

func TestWatchRefreshAndClose(t *testing.T) {
	c := newCluster(t, 0, 0)
	c.dns.SetTTL(3600)
	w, _ := watch(t, c.client(t, Config{}), "local.pgcluster.lan", WatchOptions{MinInterval: MinWatchInterval})
	c.nodes = c.nodes[:1]
	c.publish()
	if err := w.Refresh(t.Context()); err != nil {
		t.Fatal(err)
	}
	if len(w.Candidates()) != 1 {
		t.Errorf("after Refresh: %v, want one node", w.Candidates())
	}
	w.Close()
	w.Close()
	if err := w.Refresh(t.Context()); !errors.Is(err, ErrClosed) {
		t.Errorf("Refresh after Close: %v, want ErrClosed", err)
	}
}

func TestWatcherRank(t *testing.T) {
	// 40 ms against 2: a gap that scheduling on a loaded machine running
	// -race does not close (8 against 2 did, once).
	c := newCluster(t, 40*time.Millisecond, 2*time.Millisecond)
	w, _ := watch(t, c.client(t, Config{}), "local.pgcluster.lan", WatchOptions{})
	r, err := w.Rank(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := r.Best(); b.Addr != c.nodes[1].Addr {
		t.Errorf("best %s, want the 2 ms node %s", b.Addr, c.nodes[1].Addr)
	}
	accepted := c.pgs[0].Accepted() + c.pgs[1].Accepted()
	if _, err := w.Rank(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := c.pgs[0].Accepted() + c.pgs[1].Accepted(); n != accepted {
		t.Errorf("a second Rank probed again (%d probes, want %d)", n, accepted)
	}
}

func TestWatchOptionsNext(t *testing.T) {
	o := WatchOptions{Interval: 30 * time.Second, MinInterval: time.Second}
	tests := []struct {
		ttl      time.Duration
		failures int
		want     time.Duration
		why      Reason
	}{
		{ttl: 5 * time.Second, want: 5 * time.Second, why: ReasonTTL},
		{ttl: 0, want: time.Second, why: ReasonTTL},
		{ttl: time.Hour, want: 30 * time.Second, why: ReasonTimer},
		{failures: 1, want: time.Second, why: ReasonRetry},
		{failures: 3, want: 4 * time.Second, why: ReasonRetry},
		{failures: 40, want: maxRetryInterval, why: ReasonRetry},
	}
	for _, tc := range tests {
		got, why := o.next(tc.ttl, tc.failures)
		if got != tc.want || why != tc.why {
			t.Errorf("next(%s, %d) = %s %s, want %s %s", tc.ttl, tc.failures, got, why, tc.want, tc.why)
		}
	}
}

func TestWatchOptionsPrimaryName(t *testing.T) {
	tests := []struct {
		opts WatchOptions
		name string
		want string
	}{
		{name: "prod.pgcluster.lan.", want: "primary.prod.pgcluster.lan."},
		{name: "primary.prod.pgcluster.lan.", want: ""},
		{name: "Standby.prod.pgcluster.lan.", want: ""},
		{name: "prefer-standby.prod.pgcluster.lan.", want: ""},
		{opts: WatchOptions{IgnorePrimary: true}, name: "prod.pgcluster.lan.", want: ""},
		{opts: WatchOptions{Primary: "leader.lan"}, name: "prod.pgcluster.lan.", want: "leader.lan."},
	}
	for _, tc := range tests {
		if got := tc.opts.primaryName(tc.name); got != tc.want {
			t.Errorf("primaryName(%q) = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// Intervals below MinWatchInterval are refused before any query: with an
// Interval of 1ns a Watcher used to resolve thousands of times a second.
func TestWatchRefusesShortIntervals(t *testing.T) {
	c := newCluster(t, 0)
	cl := c.client(t, Config{})
	for _, o := range []WatchOptions{
		{Interval: time.Nanosecond},
		{Interval: MinWatchInterval - 1},
		{Interval: -time.Second},
		{MinInterval: time.Nanosecond},
		{MinInterval: -1},
	} {
		if w, err := cl.Watch(t.Context(), "local.pgcluster.lan", o); err == nil || !strings.Contains(err.Error(), "below the floor") {
			if w != nil {
				w.Close()
			}
			t.Errorf("Watch with Interval %s MinInterval %s: %v, want it refused", o.Interval, o.MinInterval, err)
		}
	}
	if n := c.dns.Queries(); n != 0 {
		t.Errorf("%d queries sent", n)
	}
	w, err := cl.Watch(t.Context(), "local.pgcluster.lan", WatchOptions{Interval: MinWatchInterval, MinInterval: MinWatchInterval})
	if err != nil {
		t.Fatalf("Watch at the floor: %v", err)
	}
	w.Close()
}
