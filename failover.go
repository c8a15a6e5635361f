package pgcluster

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Alias fail-over: an alias with fallbacks (pgcluster_aliases.fallback)
// moves to the first of them that serves once its target has not served
// for failover_after, forward only, and back only when an operator says
// so (pgclusterctl failback deletes its pgcluster_alias_state row) or,
// with failback auto, once its own target has served again for as long.
// Where it points lives in the registry, so that every instance points
// the same way at the same time and a restart changes nothing: the
// instance that follows PostgreSQL for the fleet (the relay's follower,
// or every instance without the relay) writes the move, and every
// instance, itself included, points the alias anew when the registry
// notifies the change. A write that fails moves nothing: safety before
// availability.

const (
	// moverTick is how often the mover looks at the targets: a bound on
	// how late after failover_after a move is written.
	moverTick = 100 * time.Millisecond
	// moverRetry is how long after a failed write the mover tries again.
	moverRetry = time.Second
	// moverTimeout bounds one connection or write.
	moverTimeout = 5 * time.Second
)

// moveQuery writes a move of alias $1 to $2 (why $3, by $4, in relay term
// $5) if the alias still points where the snapshot read it did ($6: the
// target its row named, "" when it had none, pointing at its own target)
// and no newer term wrote it: the compare-and-set that makes two
// instances that decide the same move at once write it once, and keeps a
// follower whose term has passed from undoing a newer one's move.
const moveQuery = `INSERT INTO pgcluster_alias_state AS s (alias, target, reason, moved_by, term)
  SELECT $1, $2, $3, $4, $5 WHERE $6::text = ''
ON CONFLICT (alias) DO UPDATE SET target = EXCLUDED.target, reason = EXCLUDED.reason,
  moved_at = now(), moved_by = EXCLUDED.moved_by, term = EXCLUDED.term
  WHERE s.term <= EXCLUDED.term AND lower(s.target) = lower($6::text)`

// failbackQuery points alias $1 at its own target again (failback auto),
// if its row still names $2 and no newer term than $3 wrote it.
const failbackQuery = `DELETE FROM pgcluster_alias_state WHERE alias = $1 AND lower(target) = lower($2) AND term <= $3`

// aliasMover decides and writes the moves of the aliases that may fail
// over, from the snapshot answered (the fleet's verdicts included).
type aliasMover struct {
	set  *settings
	snap func() *snapshot
	// term is the relay term this instance follows PostgreSQL in (0
	// without the relay): writes are fenced by it.
	term func() int64
	// allowed, when set, says whether this instance may move aliases now
	// (the relay's follower may; one that follows PostgreSQL only because
	// Redis does not answer may not).
	allowed func() bool
	by      string // moved_by: this instance

	bad     map[string]time.Time // by alias as stored: since its target was first seen not serving
	good    map[string]time.Time // since its own target was first seen serving again (failback auto)
	retryAt map[string]time.Time // no write before then, after one that failed or moved nothing
	conn    *pgx.Conn
	// read is the aliases of the snapshot last looked at (see aliasesOf).
	read moverAliases
}

// moverAliases is what a round needs of a snapshot's aliases, made once per
// snapshot: a round every moverTick looks at the aliases with fallbacks
// only, and at none when no alias has any.
type moverAliases struct {
	of       *aliasBuild
	names    map[string]bool // every alias, in lower case
	failover []Alias         // the rows with fallbacks
}

// aliasesOf is moverAliases of ab, made again only when ab is not the last.
func (m *aliasMover) aliasesOf(ab *aliasBuild) moverAliases {
	if m.read.of == ab {
		return m.read
	}
	r := moverAliases{of: ab, names: map[string]bool{}}
	for _, a := range ab.rows {
		r.names[strings.ToLower(a.Alias)] = true
		if a.Fallback != "" {
			r.failover = append(r.failover, a)
		}
	}
	m.read = r
	return r
}

func newAliasMover(set *settings, snap func() *snapshot, term func() int64) *aliasMover {
	by := set.instance
	if by == "" {
		by = hostName()
	}
	return &aliasMover{set: set, snap: snap, term: term, by: by,
		bad: map[string]time.Time{}, good: map[string]time.Time{}, retryAt: map[string]time.Time{}}
}

// run looks at the aliases every moverTick until ctx is done.
func (m *aliasMover) run(ctx context.Context) {
	t := time.NewTicker(moverTick)
	defer t.Stop()
	defer m.close()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.round(ctx, time.Now())
		}
	}
}

// round looks at every alias with fallbacks once, as of now, and writes
// what moves.
func (m *aliasMover) round(ctx context.Context, now time.Time) {
	s := m.snap()
	if s == nil || s.aliases == nil || m.allowed != nil && !m.allowed() {
		clear(m.bad)
		clear(m.good)
		return
	}
	read := m.aliasesOf(s.aliases)
	aliases := read.names
	live := map[string]bool{}
	for _, r := range read.failover {
		live[r.Alias] = true
		cur := r.effective()
		if targetServes(s, cur, r.when(), false) {
			delete(m.bad, r.Alias)
		} else if _, ok := m.bad[r.Alias]; !ok {
			m.bad[r.Alias] = now
		}
		own := strings.EqualFold(cur, r.Target)
		if own || r.Failback != failbackAuto || !targetServes(s, r.Target, r.when(), true) {
			delete(m.good, r.Alias)
		} else if _, ok := m.good[r.Alias]; !ok {
			m.good[r.Alias] = now
		}
		if now.Before(m.retryAt[r.Alias]) {
			continue
		}
		if since, ok := m.bad[r.Alias]; ok && now.Sub(since) >= r.after() {
			if next := nextTarget(s, r, cur, aliases); next != "" {
				m.write(ctx, r, now, func(ctx context.Context, conn *pgx.Conn) (bool, error) {
					return m.move(ctx, conn, r, cur, next, now.Sub(since))
				})
			}
			continue
		}
		if since, ok := m.good[r.Alias]; ok && now.Sub(since) >= r.after() {
			m.write(ctx, r, now, func(ctx context.Context, conn *pgx.Conn) (bool, error) {
				tag, err := conn.Exec(ctx, failbackQuery, r.Alias, r.Moved, m.term())
				if err == nil && tag.RowsAffected() == 1 {
					log.Infof("Alias %q: failed back from %s to %s, which has served for %s (failback auto)", r.Alias, cur, r.Target, r.after())
				}
				return tag.RowsAffected() == 1, err
			})
		}
	}
	for a := range m.bad {
		if !live[a] {
			delete(m.bad, a)
			delete(m.good, a)
			delete(m.retryAt, a)
		}
	}
}

// nextTarget is the first target after cur in r's list that the alias may
// fail over to and that serves now, "" when none.
func nextTarget(s *snapshot, r Alias, cur string, aliases map[string]bool) string {
	list := r.targets()
	i := 0
	for k, t := range list {
		if strings.EqualFold(t, cur) {
			i = k
			break
		}
	}
	for _, f := range list[i+1:] {
		if usableFallback(r, f, aliases) && targetServes(s, f, r.when(), true) {
			return f
		}
	}
	return ""
}

// targetServes reports whether the cluster name serves as when judges:
// no_primary, a node serving as primary (several, a split brain, or one
// drained count: neither moves an alias; a primary held by primary_hold
// too); no_nodes, a node serving. A candidate to move to must serve
// plainly: exactly one primary, not drained, or a serving node not
// drained.
func targetServes(s *snapshot, name, when string, candidate bool) bool {
	cb := s.clusters[strings.ToLower(name)]
	if !cb.served() {
		return false
	}
	st := cb.stat
	if when == failNoNodes {
		if candidate {
			return st.serving > 0
		}
		return st.serving+st.drained > 0
	}
	if !candidate {
		return len(st.primaries) > 0 || st.held != ""
	}
	if len(st.primaries) != 1 {
		return false
	}
	for _, n := range cb.rows {
		if strings.EqualFold(n.Name, st.primaries[0]) && n.Drain.drained() {
			return false
		}
	}
	return true
}

// move writes r's move from cur to next.
func (m *aliasMover) move(ctx context.Context, conn *pgx.Conn, r Alias, cur, next string, down time.Duration) (bool, error) {
	what := "no serving primary"
	if r.when() == failNoNodes {
		what = "no serving node"
	}
	why := fmt.Sprintf("%s in %s for %s", what, cur, down.Round(time.Second))
	tag, err := conn.Exec(ctx, moveQuery, r.Alias, next, why, m.by, m.term(), r.Moved)
	if err != nil {
		return false, err
	}
	if tag.RowsAffected() != 1 {
		return false, nil
	}
	log.Infof("Alias %q: failed over from %s to %s: %s", r.Alias, cur, next, why)
	return true, nil
}

// write runs one write of r's state on the mover's connection (made when
// there is none), and plans the next try: a write that failed or moved
// nothing (another instance's came first, or a newer term's) is not tried
// again before moverRetry, the snapshot having caught up by then.
func (m *aliasMover) write(ctx context.Context, r Alias, now time.Time, do func(context.Context, *pgx.Conn) (bool, error)) {
	m.retryAt[r.Alias] = now.Add(moverRetry)
	ctx, cancel := context.WithTimeout(ctx, moverTimeout)
	defer cancel()
	if m.conn == nil {
		cfg, err := pgx.ParseConfig(m.set.dsn)
		if err != nil {
			return
		}
		cfg.ConnectTimeout = moverTimeout
		cfg.RuntimeParams["application_name"] = "coredns-pgcluster-failover"
		if m.conn, err = pgx.ConnectConfig(ctx, cfg); err != nil {
			m.conn = nil
			failoverWrites.WithLabelValues(m.set.zones[0], "error").Inc()
			log.Warningf("Alias %q: cannot write its fail-over to the registry (it does not move): %s", r.Alias, errText(err, m.set.dsn))
			return
		}
	}
	moved, err := do(ctx, m.conn)
	switch {
	case err != nil:
		failoverWrites.WithLabelValues(m.set.zones[0], "error").Inc()
		p := diagnose(err, dsnUser(m.set.dsn))
		log.Warningf("Alias %q: cannot write its fail-over to the registry (it does not move): %s. To fix: %s. Error: %s", r.Alias, p.what, failoverTodo(p.todo, dsnUser(m.set.dsn)), errText(err, m.set.dsn))
		m.close()
	case moved:
		failoverWrites.WithLabelValues(m.set.zones[0], "moved").Inc()
	default:
		failoverWrites.WithLabelValues(m.set.zones[0], "unchanged").Inc()
	}
}

// failoverTodo is what to do when the mover may not write: the grant on
// pgcluster_alias_state, whatever the diagnosis says of the tables read.
func failoverTodo(todo, user string) string {
	if strings.Contains(todo, "GRANT") {
		return "GRANT SELECT, INSERT, UPDATE, DELETE ON pgcluster_alias_state TO " + user
	}
	return todo
}

func (m *aliasMover) close() {
	if m.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	m.conn.Close(ctx)
	cancel()
	m.conn = nil
}
