package discovery

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool is a pgxpool.Pool whose connections follow the DNS answer for its
// host, kept current by a Watcher:
//
//   - new connections go to the fastest reachable node (Watcher.LookupFunc),
//     without asking DNS on the connect path;
//   - a connection whose node left the answer is never handed out again
//     (PrepareConn), is closed when released (AfterRelease), and when idle
//     is closed as soon as the Watcher sees the node leave;
//   - an error of a switchover (SQLSTATE 57P01, 57P02, 57P03, 25006; a
//     connection to the primary refused, reset or lost) makes the Watcher
//     resolve again at once, then at MinWatchInterval while they go on (see
//     Watcher.ReportError); the connection that got it is closed, and new
//     connections wait for that resolution instead of going back to the
//     old primary; other failed connection attempts make it resolve again
//     within MinInterval.
//
// Point the pool at primary.CLUSTER for writes: after a failover the old
// primary leaves that answer, its connections are closed and new ones reach
// the new primary. Such a pool also asks for the primary's state every
// WatchOptions.StateInterval, so it stops writing to a primary soon after
// pgcluster stops naming it (a split brain, another primary). Between the
// old primary leaving and DNS naming the new one, it keeps a connection
// waiting on each of the cluster's serving nodes and hands out the first
// whose node takes writes (WatchOptions.ReadWriteFallback). Point it at
// CLUSTER or standby.CLUSTER for reads.
type Pool struct {
	*pgxpool.Pool
	watcher *Watcher
	warmer  *warmer
}

// NewPool parses connString with pgxpool.ParseConfig and calls
// NewPoolWithConfig.
func (c *Client) NewPool(ctx context.Context, connString string, opts WatchOptions) (*Pool, error) {
	cfg, err := pgxpool.ParseConfig(connString)
	if err != nil {
		return nil, err
	}
	return c.NewPoolWithConfig(ctx, cfg, opts)
}

// NewPoolWithConfig watches cfg's host and returns a pool wired to the
// Watcher as Pool describes. The hooks already in cfg (DialFunc, OnPgError,
// ValidateConnect, Tracer, PrepareConn or BeforeAcquire, AfterRelease,
// BeforeClose) still run. ctx bounds the first resolution, which must
// succeed, and pgxpool's own start.
func (c *Client) NewPoolWithConfig(ctx context.Context, cfg *pgxpool.Config, opts WatchOptions) (*Pool, error) {
	var (
		pool atomic.Pointer[pgxpool.Pool]
		warm atomic.Pointer[warmer]
	)
	opts.pool = true
	opts.onServeLost = func() {
		if p := pool.Load(); p != nil {
			closeIdle(p)
		}
	}
	opts.onFallback = func() {
		if wm := warm.Load(); wm != nil {
			wm.kick()
		}
	}
	w, err := c.watch(ctx, cfg.ConnConfig.Host, c.port, cfg.ConnConfig.Port, opts)
	if err != nil {
		return nil, err
	}
	wirePool(cfg, w)
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		w.Close()
		return nil, err
	}
	pool.Store(p)
	wm := newWarmer(p, w)
	warm.Store(wm)
	wm.kick() // the fallback may be on from the first resolution
	return &Pool{Pool: p, watcher: w, warmer: wm}, nil
}

// Watcher returns the Watcher the pool follows.
func (p *Pool) Watcher() *Watcher { return p.watcher }

// Close stops the Watcher and closes the pool.
func (p *Pool) Close() {
	p.warmer.cancel()
	p.watcher.Close()
	p.Pool.Close()
	p.warmer.stop()
}

// wirePool installs the Watcher's hooks in cfg, around the ones there.
func wirePool(cfg *pgxpool.Config, w *Watcher) {
	cc := &cfg.ConnConfig.Config
	cc.LookupFunc = w.LookupFunc()
	cc.DialFunc = w.DialFunc(cc.DialFunc)
	if w.readWrite {
		cc.ValidateConnect = w.validateConnect(cc.ValidateConnect)
	}
	cfg.ConnConfig.Tracer = withConnectReporter(cfg.ConnConfig.Tracer, w)
	onPgError := cc.OnPgError
	cc.OnPgError = func(pc *pgconn.PgConn, pe *pgconn.PgError) bool {
		keep := onPgError == nil || onPgError(pc, pe)
		if w.classify(pe).switchover {
			w.ReportError(pe)
			return false
		}
		return keep
	}

	prepare := cfg.PrepareConn
	if before := cfg.BeforeAcquire; prepare == nil && before != nil {
		prepare = func(ctx context.Context, conn *pgx.Conn) (bool, error) { return before(ctx, conn), nil }
	}
	cfg.BeforeAcquire = nil
	cfg.PrepareConn = func(ctx context.Context, conn *pgx.Conn) (bool, error) {
		if !w.serves(conn) {
			return false, nil
		}
		if prepare != nil {
			return prepare(ctx, conn)
		}
		return true, nil
	}

	release := cfg.AfterRelease
	cfg.AfterRelease = func(conn *pgx.Conn) bool {
		return w.serves(conn) && (release == nil || release(conn))
	}

	beforeClose := cfg.BeforeClose
	cfg.BeforeClose = func(conn *pgx.Conn) {
		if conn.IsClosed() { // it broke before the pool let it go
			addr, _ := remoteAddr(conn.PgConn().Conn())
			w.ReportError(&connLost{addr: addr})
		}
		if beforeClose != nil {
			beforeClose(conn)
		}
	}
}

// serves reports whether conn goes to a node the Pool keeps connections
// to: one in the current answer or, during the read-write fallback, one of
// the cluster's serving nodes. A connection that is not over TCP is not
// the Watcher's to judge.
func (w *Watcher) serves(conn *pgx.Conn) bool {
	addr, ok := remoteAddr(conn.PgConn().Conn())
	if !ok {
		return true
	}
	return w.served(w.view.Load())[addr]
}

// closeIdle closes the idle connections to nodes that left: acquiring them
// runs PrepareConn, which refuses those, and pgxpool destroys what it
// refuses; the others go back.
func closeIdle(p *pgxpool.Pool) {
	for _, c := range p.AcquireAllIdle(context.Background()) {
		c.Release()
	}
}
