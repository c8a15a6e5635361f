package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Channel is the LISTEN channel the schema's triggers notify on every change.
const Channel = "pgcluster_changed"

const (
	minBackoff     = 100 * time.Millisecond
	maxBackoff     = 5 * time.Second
	connectTimeout = 5 * time.Second
	loadTimeout    = 10 * time.Second
	// closeTimeout bounds the goodbye sent to a server that may not answer.
	closeTimeout = time.Second

	// gatherWait is how long the notifications after a first one are
	// waited for: PostgreSQL sends all of a transaction's notifications at
	// once, one after another, so that the rest are in the bytes already
	// received, or follow within microseconds.
	gatherWait = 200 * time.Microsecond
	// maxRereads bounds the reads made again because notifications that
	// arrived during a read name rows it did not read (see load); the
	// next one reads everything, which no notification can leave partial.
	maxRereads = 3

	// pingEvery is how often the connection is pinged while waiting for
	// notifications, and pingTimeout how long a ping may take: a registry
	// that stops answering (frozen, or cut off without a reset) is noticed
	// within their sum, then reconnected.
	pingEvery   = 2 * time.Second
	pingTimeout = 2 * time.Second

	// TCP keepalive on the registry connection, so that the kernel gives up
	// on a peer that is gone even while nothing is sent.
	keepAliveIdle     = 5 * time.Second
	keepAliveInterval = 2 * time.Second
	keepAliveCount    = 3
)

const (
	heartbeatAgeColumn = `CASE WHEN heartbeat IS NULL OR heartbeat = '-infinity' THEN 'Infinity'::float8
       WHEN heartbeat = 'infinity' THEN '-Infinity'::float8
       ELSE extract(epoch FROM clock_timestamp() - heartbeat)::float8
  END AS heartbeat_age`
	// drainColumns are the drain a node is read with: of the drains that
	// match it and have not ended by PostgreSQL's clock, the one that
	// lasts longest, NULLs when none. drain_left is how long it has left
	// by that clock (NULL: no end), so that the follower reads the node
	// again the moment it ends.
	drainColumns = `d.drain_id, d.drain_reason, d.drain_by, d.drain_until, d.drain_left`
	drainJoin    = `
LEFT JOIN LATERAL (
  SELECT id AS drain_id, reason AS drain_reason, created_by AS drain_by,
    CASE WHEN isfinite(until) THEN until END AS drain_until,
    CASE WHEN isfinite(until) THEN extract(epoch FROM until - clock_timestamp())::float8 END AS drain_left
  FROM pgcluster_drains dr
  WHERE lower(dr.cluster) = lower(n.cluster)
    AND (dr.node IS NULL OR lower(dr.node) = lower(n.name))
    AND (dr.zone IS NULL OR %s)
    AND (dr.until IS NULL OR dr.until > clock_timestamp())
  ORDER BY dr.until IS NULL DESC, dr.until DESC, dr.id
  LIMIT 1) d ON true`
	noDrainColumns = `NULL::bigint AS drain_id, NULL::text AS drain_reason, NULL::text AS drain_by,
  NULL::timestamptz AS drain_until, NULL::float8 AS drain_left`
	// aliasesQuery reads each alias with its fail-over settings and where
	// it points now (aliasesQueryPlain: a registry made before fail-over,
	// or a role that may not read pgcluster_alias_state).
	aliasesQuery = `SELECT a.alias, a.target, array_to_string(a.fallback, ',') AS fallback, a.failover_when,
  extract(epoch FROM a.failover_after)::float8 AS failover_after, a.failback,
  coalesce(s.target, '') AS moved, coalesce(s.reason, '') AS why,
  coalesce((extract(epoch FROM s.moved_at) * 1000000)::bigint, 0) AS moved_at
FROM pgcluster_aliases a LEFT JOIN pgcluster_alias_state s ON s.alias = a.alias`
	aliasesQueryPlain = `SELECT a.alias, a.target, '' AS fallback, '' AS failover_when, 0::float8 AS failover_after,
  '' AS failback, '' AS moved, '' AS why, 0::bigint AS moved_at
FROM pgcluster_aliases a`
	networksQuery = `SELECT network, coalesce(region, '') AS region, coalesce(zone, '') AS zone FROM pgcluster_networks`
)

// nodesQuery reads every row of pgcluster_nodes (a WHERE clause may follow)
// of a registry of shape sh, each heartbeat's age measured by PostgreSQL's
// clock (no row can make it fail: an infinite heartbeat, which the
// subtraction refuses, is infinitely old or young, and a missing one
// counts as infinitely old), with its place and its drain when the
// registry has them.
func nodesQuery(sh registryShape) string {
	place := `coalesce(region, '') AS region, coalesce(zone, '') AS zone`
	zoneMatch := `lower(dr.zone) = lower(n.zone)`
	if !sh.places {
		place, zoneMatch = `'' AS region, '' AS zone`, `false`
	}
	drain, join := noDrainColumns, ""
	if sh.drains {
		drain, join = drainColumns, fmt.Sprintf(drainJoin, zoneMatch)
	}
	return `SELECT cluster, name, address, port, role, healthy, ` + heartbeatAgeColumn + `,
  CASE WHEN isfinite(heartbeat) THEN heartbeat END AS heartbeat,
  ` + place + `,
  ` + drain + `
FROM pgcluster_nodes n` + join
}

// registry follows the peer registry in PostgreSQL. It keeps one connection:
// LISTEN first, then a full load, then a reload on every notification (those
// that queued up meanwhile are coalesced into one), on every refresh tick and
// when a heartbeat is about to cross stale_after or a drain ends. Between notifications the
// connection is pinged, so a registry that goes silent is noticed within
// seconds. A lost connection is retried with backoff; each new connection
// listens and reloads in full, so a change made while it was away is not
// missed.
type registry struct {
	set *settings
	key string // where the last load is kept across reloads; "" keeps nothing
	// apply receives what every successful load changed.
	apply func(rowsUpdate)
	// onSession, when set, hears each session come up (true) and fail
	// (false): the relay vouches for its copy only while one is up.
	onSession func(up bool)

	// Touched only by start-up (restore) and then run's goroutine.
	wasUp   bool   // last state logged
	lastErr string // what of the last failure logged
	// connected names the server of the session up (see setUp), "" while down.
	connected string
	served    bool // a snapshot is served: loaded, or restored from the last instance
	kept      bool // holds a place in lastLoads

	// rows is the registry as followed, and published each served
	// cluster's rows as last handed to the publisher (with their heartbeat
	// ages then): what a heartbeat read is compared with.
	rows      rowSet
	published map[string][]Node
	// pending is what notifications received during the last read name:
	// read next, since that read's snapshot may not have held their
	// transactions.
	pending changes
	// shape is what of the places the registry has (see registryShape),
	// read again with every full read and networks change; shapeWarned
	// what was last logged of it.
	shape       registryShape
	shapeWarned string

	// mover, when set, moves the aliases that fail over while this
	// registry is followed (see failover.go).
	mover *aliasMover

	loaded chan struct{} // closed after the first successful load
	done   chan struct{} // closed when run returns
}

func newRegistry(set *settings, key string, apply func(rowsUpdate)) *registry {
	return &registry{
		set: set, key: key, apply: apply,
		wasUp:  true, // so that a first failure is logged
		loaded: make(chan struct{}),
		done:   make(chan struct{}),
	}
}

// restore publishes the rows that the instance before this one (same DSN and
// zones, before a Corefile reload) loaded last, so that answers go on while
// the registry is unreachable. It reports whether there were any. Call it
// once, before run.
func (r *registry) restore() bool {
	// The heartbeat ages stay as loaded: while the registry cannot be read,
	// no heartbeat is judged stale (nobody could write one).
	u, last := lastLoads.restore(r.key, &r.kept)
	if last == nil {
		return false
	}
	nodes := 0
	for _, ns := range u.nodes {
		nodes += len(ns)
	}
	r.apply(u)
	r.served = true
	log.Infof("Registry %s: serving the %d nodes and %d aliases loaded %s ago until it loads again",
		redact(r.set.dsn), nodes, len(last.rows.aliases), time.Since(last.loadedAt).Round(time.Millisecond))
	return true
}

// run follows the registry until ctx is done.
func (r *registry) run(ctx context.Context) {
	defer close(r.done)
	defer func() {
		if r.kept {
			lastLoads.release(r.key)
		}
	}()
	if r.mover != nil {
		mctx, cancel := context.WithCancel(ctx)
		moved := make(chan struct{})
		go func() {
			defer close(moved)
			r.mover.run(mctx)
		}()
		defer func() {
			cancel()
			<-moved
		}()
	}
	backoff := minBackoff
	for {
		err := r.session(ctx, func() { backoff = minBackoff })
		if ctx.Err() != nil {
			return
		}
		r.setDown(err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

// session is one connection's life: LISTEN, load, then wait and reload until
// the connection fails. loadedOK is called after each successful load.
func (r *registry) session(ctx context.Context, loadedOK func()) error {
	cfg, err := pgx.ParseConfig(r.set.dsn)
	if err != nil {
		return err
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "coredns-pgcluster"
	}
	dialer := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
		Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount,
	}}
	cfg.DialFunc = dialer.DialContext
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		conn.Close(cctx)
		cancel()
	}()

	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		return err
	}
	// The full load reads whatever the notifications of the last session
	// named.
	r.pending = changes{}
	next, err := r.load(ctx, conn, nil)
	if err != nil {
		return err
	}
	loadedOK()
	r.setUp(connectedRegistry(conn))
	fullAt := time.Now().Add(r.set.refresh)
	for {
		due := min(time.Until(fullAt), next, r.ageTick())
		ch, err := r.wait(ctx, conn, due)
		if err != nil {
			return err
		}
		switch {
		case ch.full || !time.Now().Before(fullAt):
			next, err = r.load(ctx, conn, nil)
			fullAt = time.Now().Add(r.set.refresh)
		case ch.any():
			next, err = r.load(ctx, conn, &ch)
		default:
			// A drain ended by PostgreSQL's clock: nobody wrote, so
			// nothing notifies; its nodes are read again (the relay then
			// publishes them to the fleet at once).
			if ended := r.rows.drainsEnded(time.Now()); len(ended) > 0 {
				next, err = r.load(ctx, conn, &changes{clusters: ended, aliases: map[string]bool{}})
			} else {
				next, err = r.checkAges(ctx, conn)
			}
		}
		if err != nil {
			return err
		}
		loadedOK()
	}
}

// wait blocks until a notification arrives or d has passed, pinging the
// connection every pingEvery meanwhile, then gathers the notifications
// already received and those that follow the first within gatherWait: one
// read covers them all, and so every notification of the transaction that
// sent the first (PostgreSQL sends them together). It returns what they
// say changed, with what was pending; with something pending, it does not
// block.
func (r *registry) wait(ctx context.Context, conn *pgx.Conn, d time.Duration) (changes, error) {
	ch := r.pending
	r.pending = changes{}
	due := time.Now().Add(d)
	for !ch.any() {
		left := time.Until(due)
		if left <= 0 {
			return ch, nil
		}
		wctx, cancel := context.WithTimeout(ctx, min(left, pingEvery))
		n, err := conn.WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return ch, ctx.Err()
		}
		if err == nil {
			ch.add(n.Payload)
			break
		}
		if !pgconn.Timeout(err) || wctx.Err() == nil {
			return ch, err
		}
		if time.Until(due) <= 0 {
			return ch, nil
		}
		pctx, cancel := context.WithTimeout(ctx, pingTimeout)
		err = conn.Ping(pctx)
		cancel()
		if ctx.Err() != nil {
			return ch, ctx.Err()
		}
		if err != nil {
			return ch, fmt.Errorf("no answer to a ping within %s: %w", pingTimeout, err)
		}
	}
	// A wait bounded by a deadline returns the notifications in the bytes
	// already read before it looks at the deadline (a done context would
	// return only those parsed already).
	gctx, cancel := context.WithTimeout(ctx, gatherWait)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(gctx)
		if n != nil {
			ch.add(n.Payload)
			continue
		}
		if ctx.Err() != nil {
			return ch, ctx.Err()
		}
		if err != nil && (!pgconn.Timeout(err) || gctx.Err() == nil) {
			return ch, err
		}
		return ch, nil
	}
}

// received returns what the notifications received during the last
// query, and parsed with its reply, say changed.
func received(ctx context.Context, conn *pgx.Conn) changes {
	var ch changes
	done, cancel := context.WithCancel(ctx)
	cancel()
	for {
		// With a done context this returns only notifications already parsed.
		n, _ := conn.WaitForNotification(done)
		if n == nil {
			return ch
		}
		ch.add(n.Payload)
	}
}

// nodeRow and aliasRow are the registry's rows as scanned.
type nodeRow struct {
	Cluster      string       `db:"cluster"`
	Name         string       `db:"name"`
	Address      netip.Prefix `db:"address"`
	Port         int32        `db:"port"`
	Role         string       `db:"role"`
	Healthy      bool         `db:"healthy"`
	HeartbeatAge float64      `db:"heartbeat_age"` // seconds; ±Inf for infinite heartbeats
	Heartbeat    *time.Time   `db:"heartbeat"`     // nil when not finite
	Region       string       `db:"region"`
	Zone         string       `db:"zone"`
	DrainID      *int64       `db:"drain_id"`
	DrainReason  *string      `db:"drain_reason"`
	DrainBy      *string      `db:"drain_by"`
	DrainUntil   *time.Time   `db:"drain_until"` // nil: no end
	DrainLeft    *float64     `db:"drain_left"`  // seconds, by PostgreSQL's clock
}

type aliasRow struct {
	Alias    string  `db:"alias"`
	Target   string  `db:"target"`
	Fallback string  `db:"fallback"`
	When     string  `db:"failover_when"`
	After    float64 `db:"failover_after"` // seconds
	Failback string  `db:"failback"`
	Moved    string  `db:"moved"`
	Why      string  `db:"why"`
	MovedAt  int64   `db:"moved_at"` // Unix µs
}

type networkRow struct {
	Network netip.Prefix `db:"network"`
	Region  string       `db:"region"`
	Zone    string       `db:"zone"`
}

// load reads the rows ch names (all of both tables when ch is nil or asks
// for a full read) in one repeatable-read snapshot and applies the registry
// with them in place of the ones held. It returns how long until heartbeats
// must be looked at again.
//
// A transaction is applied whole, never in part. Its notifications arrive
// together, before the reply to any query sent after the first of them,
// so those that wait did not gather arrive during the read, and the
// snapshot holds their transaction: when they name rows the read did not
// read, the read is made again, of everything named, in one new snapshot.
// So is it when they belong to a transaction that committed during the
// read, and the snapshot may hold it. Those that name only rows read are
// read again next (pending): the snapshot may be older than their
// transaction. What this cannot see is a transaction whose notifications
// arrive after the reply though the snapshot holds it: PostgreSQL makes a
// commit visible a moment before it signals the listeners, and delivers
// notifications of more than a queue page (8 kB) in parts. Such a
// transaction shows in part only where the read reads rows it changed for
// an earlier one, and whole with the next read.
func (r *registry) load(ctx context.Context, conn *pgx.Conn, ch *changes) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	var nodes []nodeRow
	var as []aliasRow
	var nets []networkRow
	if ch == nil || ch.full || ch.networks || r.shape != fullShape {
		sh, err := readShape(ctx, conn)
		if err != nil {
			reloads.WithLabelValues(r.zone(), "error").Inc()
			return 0, err
		}
		r.shape = sh
		if w := shapeWarning(sh, dsnUser(r.set.dsn)); w != r.shapeWarned {
			if w != "" {
				log.Warning(w)
			}
			r.shapeWarned = w
		}
	}
	for reads := 1; ; reads++ {
		var err error
		nodes, as, nets, err = readRegistry(ctx, conn, ch, r.shape)
		if err != nil {
			reloads.WithLabelValues(r.zone(), "error").Inc()
			return 0, err
		}
		during := received(ctx, conn)
		if ch == nil || ch.covers(&during) {
			r.pending.merge(&during)
			break
		}
		ch.merge(&during)
		if reads >= maxRereads {
			ch.full = true
		}
	}
	now := time.Now()
	if ch == nil || ch.full {
		r.rows.full(nodeList(nodes), aliasList(as), networkList(nets), now)
		return r.publish(start, now, nil, true, true, true), nil
	}
	changed := r.rows.replace(ch.clusters, ch.aliases, nodeList(nodes), aliasList(as), networkList(nets), ch.networks, now)
	return r.publish(start, now, changed, false, len(ch.aliases) > 0, ch.networks), nil
}

// checkAges reads every heartbeat's age (a heartbeat written notifies
// nothing) and publishes only when stale_after now judges one otherwise.
func (r *registry) checkAges(ctx context.Context, conn *pgx.Conn) (time.Duration, error) {
	if r.set.staleAfter <= 0 {
		return r.nextReload(time.Now()), nil
	}
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	ages, err := readAges(ctx, conn)
	if err != nil {
		return 0, err
	}
	now := time.Now()
	r.rows.setAges(ages, now)
	u := rowsUpdate{nodes: make(map[string][]Node, len(r.rows.clusters))}
	for name, c := range r.rows.clusters {
		u.nodes[name] = c.nodes
	}
	changed := map[string]bool{}
	rowsChanged(&u, r.published, func(ns []Node) []Node { return ns }, r.set.staleAfter, func(name string) { changed[name] = true })
	if len(changed) > 0 {
		return r.publish(now, now, changed, false, false, false), nil
	}
	return r.nextReload(now), nil
}

// publish hands the publisher the rows of the clusters changed (all of
// them, when full) and, when they changed, the aliases and the networks, as
// of now, and returns how long until heartbeats must be looked at again.
func (r *registry) publish(start, now time.Time, changed map[string]bool, full, aliases, networks bool) time.Duration {
	u := rowsUpdate{full: full, nodes: map[string][]Node{}, loadedAt: now, readAt: start}
	if full || r.published == nil {
		r.published = map[string][]Node{}
	}
	if full {
		changed = map[string]bool{}
		for name := range r.rows.clusters {
			changed[name] = true
		}
	}
	for name := range changed {
		c, ok := r.rows.clusters[name]
		if !ok {
			u.nodes[name] = nil
			delete(r.published, name)
			continue
		}
		ns := c.aged(now)
		u.nodes[name], r.published[name] = ns, ns
	}
	if full || aliases {
		u.aliases, u.aliasesSet = r.rows.aliasList(), true
	}
	if full || networks {
		u.networks, u.networksSet = r.rows.networks, true
	}
	// Kept before answered: an instance started once an answer was seen
	// here (a Corefile reload) restores these rows, never the ones before.
	if r.kept {
		lastLoads.keep(r.key, r.rows, now)
	}
	r.apply(u)
	r.served = true
	reloads.WithLabelValues(r.zone(), "ok").Inc()
	reloadDuration.WithLabelValues(r.zone()).Observe(time.Since(start).Seconds())
	select {
	case <-r.loaded:
	default:
		close(r.loaded)
	}
	return r.nextReload(now)
}

func nodeList(rows []nodeRow) []Node {
	ns := make([]Node, len(rows))
	for i, n := range rows {
		ns[i] = n.node()
	}
	return ns
}

func aliasList(rows []aliasRow) []Alias {
	as := make([]Alias, len(rows))
	for i, a := range rows {
		as[i] = Alias{Alias: a.Alias, Target: a.Target, Fallback: a.Fallback, When: a.When,
			After: heartbeatAge(a.After), Failback: a.Failback, Moved: a.Moved, Why: a.Why, MovedAt: a.MovedAt}
	}
	return as
}

func networkList(rows []networkRow) []Network {
	ns := make([]Network, len(rows))
	for i, n := range rows {
		ns[i] = Network{Network: n.Network.Masked(), Region: n.Region, Zone: n.Zone}
	}
	return ns
}

// node converts a scanned row.
func (n nodeRow) node() Node {
	return Node{
		Cluster: n.Cluster, Name: n.Name,
		Address: n.Address.Addr(), Network: network(n.Address),
		Port: int(n.Port), Role: n.Role, Healthy: n.Healthy,
		HeartbeatAge: heartbeatAge(n.HeartbeatAge), Heartbeat: heartbeatTime(n.Heartbeat),
		Region: n.Region, Zone: n.Zone, Drain: n.drain(),
	}
}

// drain converts a scanned row's drain: its end on this instance's clock
// is the time left by PostgreSQL's, from now (just after the read).
func (n nodeRow) drain() Drain {
	if n.DrainID == nil {
		return Drain{}
	}
	d := Drain{ID: *n.DrainID}
	if n.DrainReason != nil {
		d.Reason = *n.DrainReason
	}
	if n.DrainBy != nil {
		d.By = *n.DrainBy
	}
	if n.DrainUntil != nil {
		d.Until = n.DrainUntil.UnixMicro()
	}
	if n.DrainLeft != nil {
		d.EndsAt = time.Now().Add(heartbeatAge(max(*n.DrainLeft, 0)))
	}
	return d
}

func heartbeatTime(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// heartbeatAge converts an age in seconds to a Duration without overflow:
// ages beyond its range clamp to its bounds (an ancient heartbeat is as old
// as a Duration can say, +Inf too; one far in the future, or -Inf, as young),
// and NaN counts as ancient.
func heartbeatAge(seconds float64) time.Duration {
	ns := seconds * float64(time.Second)
	switch {
	case math.IsNaN(ns) || ns >= math.MaxInt64:
		return math.MaxInt64
	case ns <= math.MinInt64:
		return math.MinInt64
	}
	return time.Duration(ns)
}

// readRegistry reads, in one repeatable-read, read-only transaction sent as
// one batch (one round trip), every row of the three tables (ch nil or
// asking for a full read), or the rows of the clusters and aliases ch names
// and, when ch names any, every network: of a registry of shape sh (the
// places and networks it lacks are none).
func readRegistry(ctx context.Context, conn *pgx.Conn, ch *changes, sh registryShape) ([]nodeRow, []aliasRow, []networkRow, error) {
	all := ch == nil || ch.full
	var clusters, aliases map[string]bool
	if !all {
		clusters, aliases = ch.clusters, ch.aliases
	}
	b := &pgx.Batch{}
	b.Queue("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
	var nodes []nodeRow
	var as []aliasRow
	nq := nodesQuery(sh)
	switch {
	case all:
		b.Queue(nq).Query(collect(&nodes, "pgcluster_nodes"))
	case len(clusters) > 0:
		b.Queue(nq+" WHERE cluster = ANY($1)", slices.Collect(maps.Keys(clusters))).Query(collect(&nodes, "pgcluster_nodes"))
	}
	aq := aliasesQuery
	if !sh.failover {
		aq = aliasesQueryPlain
	}
	switch {
	case all:
		b.Queue(aq).Query(collect(&as, "pgcluster_aliases"))
	case len(aliases) > 0:
		b.Queue(aq+" WHERE a.alias = ANY($1)", slices.Collect(maps.Keys(aliases))).Query(collect(&as, "pgcluster_aliases"))
	}
	var nets []networkRow
	if sh.networks && (all || ch.networks) {
		b.Queue(networksQuery).Query(collect(&nets, "pgcluster_networks"))
	}
	b.Queue("COMMIT")
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		return nil, nil, nil, err
	}
	return nodes, as, nets, nil
}

// collect returns a batch callback that scans every row of table into dst.
func collect[T any](dst *[]T, table string) func(pgx.Rows) error {
	return func(rows pgx.Rows) error {
		var err error
		if *dst, err = pgx.CollectRows(rows, pgx.RowToStructByName[T]); err != nil {
			return fmt.Errorf("read %s: %w", table, err)
		}
		return nil
	}
}

// nextReload is the refresh interval, or sooner when a drain ends (its
// nodes are read again) or a heartbeat will cross stale_after before then
// (a fresh one growing stale, or one in the future coming within
// stale_after of now): then heartbeat ages are read again, since writing
// one notifies nothing.
func (r *registry) nextReload(now time.Time) time.Duration {
	next := r.set.refresh
	if left, ok := r.rows.nextDrainEnd(now); ok && left < next {
		next = left + time.Millisecond
	}
	if r.set.staleAfter <= 0 {
		return next
	}
	for _, c := range r.rows.clusters {
		d := now.Sub(c.at)
		for _, n := range c.nodes {
			var left time.Duration
			switch age := ageBy(n.HeartbeatAge, d); {
			case age > r.set.staleAfter:
				continue // stale for good
			case age < -r.set.staleAfter:
				left = -r.set.staleAfter - age
			default:
				left = r.set.staleAfter - age
			}
			if left < next {
				next = left + time.Millisecond
			}
		}
	}
	return next
}

// ageTick is how often heartbeat ages are read when stale_after is set:
// writing a heartbeat notifies nothing, so a node whose heartbeat comes
// back is seen within this (one that goes stale is seen on time: see
// nextReload). Half of stale_after, at most a second.
func (r *registry) ageTick() time.Duration {
	if r.set.staleAfter <= 0 {
		return r.set.refresh
	}
	return min(r.set.staleAfter/2, time.Second)
}

// setUp records a session up, connected to the registry server named
// connected (host:port/database: with several hosts in the DSN, the one
// that took the session).
func (r *registry) setUp(connected string) {
	registryUp.WithLabelValues(r.zone()).Set(1)
	if connected == "" {
		connected = redact(r.set.dsn)
	}
	if !r.wasUp {
		log.Infof("Registry %s reachable again: listening and reloaded in full", connected)
	}
	r.wasUp, r.lastErr, r.connected = true, "", connected
	if r.onSession != nil {
		r.onSession(true)
	}
}

// setDown records a failed session and logs it: once per kind of failure.
// A session that was up is named by the server it was connected to.
func (r *registry) setDown(err error) {
	registryUp.WithLabelValues(r.zone()).Set(0)
	p := diagnose(err, dsnUser(r.set.dsn))
	name := redact(r.set.dsn)
	if r.wasUp && r.connected != "" {
		name = r.connected
	}
	if r.wasUp || p.what != r.lastErr {
		log.Warning(downMessage(name, p, r.served, errText(err, r.set.dsn)))
	}
	r.wasUp, r.lastErr, r.connected = false, p.what, ""
	if r.onSession != nil {
		r.onSession(false)
	}
}

// errText is err's message without the DSN's password: an unparsable DSN,
// which its error quotes, is left out, and the password, should it appear,
// is masked.
func errText(err error, dsn string) string {
	msg := err.Error()
	var parseErr *pgconn.ParseConfigError
	if errors.As(err, &parseErr) {
		msg = "cannot parse the DSN"
		if i := strings.LastIndex(parseErr.Error(), "`: "); i >= 0 {
			msg += ": " + parseErr.Error()[i+3:]
		}
	}
	if cfg, perr := pgconn.ParseConfig(dsn); perr == nil && cfg.Password != "" {
		msg = strings.ReplaceAll(msg, cfg.Password, "xxxxx")
	}
	return msg
}

// dsnUser is the user the DSN logs in as, or "" when it cannot be parsed.
func dsnUser(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return ""
	}
	return cfg.User
}

// redact returns the DSN's host, port and database, never its password.
func redact(dsn string) string {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "(unparsable DSN)"
	}
	// Every host of a multi-host DSN, once each (sslmode=prefer adds a
	// fallback per host).
	hosts := []string{net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))}
	for _, f := range cfg.Fallbacks {
		if h := net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port))); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return strings.Join(hosts, ",") + "/" + cfg.Database
}

// network returns p when its mask is shorter than a host's, else the zero
// Prefix: inet keeps a mask with every address.
func network(p netip.Prefix) netip.Prefix {
	if p.Bits() == p.Addr().BitLen() {
		return netip.Prefix{}
	}
	return p
}

// zone is the metric label: the block's first zone.
func (r *registry) zone() string { return r.set.zones[0] }
