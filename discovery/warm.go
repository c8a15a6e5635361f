package discovery

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// warmer keeps, while a Pool's read-write fallback lasts and no serving
// node is seen to take writes, a connection of the Pool on its way to or
// waiting on each serving node (see awaitWritable), as many as the Pool has
// room for but one, which is left to the application's own connections.
// Each is an Acquire of its own, in the background: once its node takes
// writes the connection is released into the Pool, where an Acquire
// waiting for a connection gets it at once and later ones find it idle.
// Without them, a Pool acquiring one connection at a time would wait on
// one node, and reach another only with a new connection after its
// promotion.
type warmer struct {
	pool    *pgxpool.Pool
	w       *Watcher
	max     int32 // connections kept waiting at most
	running atomic.Int32
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// warmRetry and warmRetryMax bound the backoff of a warmer's Acquire that
// failed.
const (
	warmRetry    = 50 * time.Millisecond
	warmRetryMax = time.Second
)

// warmKey marks the context of the warmer's Acquire calls, which their
// connections carry.
type warmKey struct{}

func newWarmer(pool *pgxpool.Pool, w *Watcher) *warmer {
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), warmKey{}, true))
	return &warmer{pool: pool, w: w, max: pool.Config().MaxConns - 1, ctx: ctx, cancel: cancel}
}

// kick starts the connections the fallback lacks: one per serving node,
// up to max in all, until a node is seen to take writes. Called after each
// resolution that leaves the Watcher in the fallback; those already
// running go on.
func (wm *warmer) kick() {
	if !wm.wanted() {
		return
	}
	v := wm.w.view.Load()
	want := min(int32(len(v.fallback.Candidates)), wm.max)
	for {
		n := wm.running.Load()
		if n >= want {
			return
		}
		if wm.running.CompareAndSwap(n, n+1) {
			wm.wg.Go(wm.run)
		}
	}
}

// run acquires connections through the fallback, releasing each into the
// Pool, until the fallback ends or a node is seen to take writes. A failed
// attempt (a connection waits on every node already, the node is down)
// is made again after a backoff.
func (wm *warmer) run() {
	defer wm.running.Add(-1)
	retry := warmRetry
	for wm.wanted() {
		c, err := wm.pool.Acquire(wm.ctx)
		if err == nil {
			addr, _ := remoteAddr(c.Conn().PgConn().Conn())
			c.Release()
			wm.w.scout.handed(addr)
			retry = warmRetry
			continue
		}
		t := time.NewTimer(retry)
		select {
		case <-wm.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		retry = min(2*retry, warmRetryMax)
	}
}

// wanted reports whether connections are to wait on the serving nodes:
// the fallback is on, and no node was seen to take writes.
func (wm *warmer) wanted() bool {
	v := wm.w.view.Load()
	if wm.ctx.Err() != nil || !wm.w.fallbackOn(v) {
		return false
	}
	_, ok, _ := wm.w.scout.writable(v.fallback.Candidates, netip.AddrPort{})
	return !ok
}

// stop ends the background connections' loops and waits for them; their
// connections under way end with the Watcher (see awaitWritable).
func (wm *warmer) stop() {
	wm.cancel()
	wm.wg.Wait()
}
