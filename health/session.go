package health

import (
	"context"
	"time"
)

// pollQuery is what a session reads every RoleInterval: the role and a
// primary's timeline, pg_is_in_recovery() read once. Prepared once per
// session, so that a poll costs the server an execution, not a parse and a
// plan.
const pollQuery = `SELECT r,
  CASE WHEN r THEN 0 ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END
FROM (SELECT pg_is_in_recovery() AS r) s`

// pollStatement names pollQuery on a session.
const pollStatement = "pgcluster_role_poll"

// session is the connection a checker keeps open to a node it probes, to
// read its role every RoleInterval. It belongs to its worker (worker.sess)
// until it ends.
type session struct {
	ctx    context.Context
	cancel context.CancelFunc
	start  time.Time // connected; zero before
}

// release ends s and detaches it from w, once, setting the backoff before
// the next session by how long s lived.
func (c *Checker) release(w *worker, s *session) {
	s.cancel()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.sess != s {
		return
	}
	w.sess = nil
	if !s.start.IsZero() {
		w.backoff.after(time.Since(s.start), c.cfg.RoleInterval, c.cfg.Interval)
	}
}

// sessionBackoff bounds how soon a session is opened again after one that
// ended early: from RoleInterval, doubling up to Interval.
type sessionBackoff struct {
	wait      time.Duration // before the next session; 0 after one that lived long
	notBefore time.Time
}

// sessionsOn reports whether this checker keeps sessions at all.
func (c *Checker) sessionsOn() bool {
	return c.cfg.Check == CheckPostgres && c.cfg.RoleInterval > 0
}

// mayKeepSession reports whether a session to w's target may be open now:
// without Shared always; with it, when it says so.
func (c *Checker) mayKeepSession(w *worker) bool {
	if !c.sessionsOn() {
		return false
	}
	if c.cfg.Shared == nil {
		return true
	}
	s, ok := c.cfg.Shared.(Sessions)
	return ok && s.KeepSession(w.t)
}

// openSession starts w's session unless one is open or w is stopped. The
// session connects once the backoff after the last one allows.
func (c *Checker) openSession(r *run, w *worker) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped || w.sess != nil {
		return
	}
	ctx, cancel := context.WithCancel(w.ctx)
	s := &session{ctx: ctx, cancel: cancel}
	w.sess = s
	r.wg.Add(1)
	go c.runSession(r, w, s, time.Until(w.backoff.notBefore))
}

// closeSession ends w's session, if one is open.
func (w *worker) closeSession() {
	w.mu.Lock()
	s := w.sess
	w.mu.Unlock()
	if s != nil {
		s.cancel()
	}
}

// runSession connects to w's target and polls its role every RoleInterval
// until the session is closed or fails. A change of role or timeline counts
// at once. A poll that misses Timeout counts as a failed probe (a dead host
// sends no reset). When the server ends the session (it shuts down, or dies:
// 57P01, 57P02, a reset, EOF), the target is probed again at once, and a
// refusal or a server saying it is going takes it Down at once.
func (c *Checker) runSession(r *run, w *worker, s *session, wait time.Duration) {
	defer r.wg.Done()
	defer c.release(w, s)
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	s.start = time.Now()
	connectCtx, cancel := context.WithTimeout(s.ctx, c.cfg.Timeout)
	conn, _ := pgConnect(connectCtx, c.cfg.Options, c.cfg.Timeout, c.cfg.Source, w.t.Addr)
	if conn == nil {
		cancel()
		return // the probes of every Interval judge connecting
	}
	_, err := conn.Prepare(connectCtx, pollStatement, pollQuery, nil)
	if err == nil {
		err = conn.SyncConn(connectCtx)
	}
	cancel()
	if err != nil {
		conn.Close(context.Background())
		return
	}
	hc, err := conn.Hijack()
	if err != nil {
		conn.Close(context.Background())
		return
	}
	p := newPoller(hc.Conn, c.cfg.Timeout)
	c.observeSession(1)
	defer c.observeSession(-1)
	defer p.close()
	stop := context.AfterFunc(s.ctx, p.interrupt)
	defer stop()
	next := time.Now()
	for {
		// Between polls, listen: a server that shuts down or dies ends the
		// session at once (57P01, 57P02, EOF), and that is news now, not
		// at the next poll.
		next = next.Add(c.cfg.RoleInterval)
		if err := p.listen(next); err != nil {
			if s.ctx.Err() != nil {
				return
			}
			c.sessionFailed(r, w, s, err, p.closed, time.Now())
			return
		}
		at := time.Now()
		if at.Sub(next) > c.cfg.RoleInterval {
			next = at // fell behind (a slow poll): no burst to catch up
		}
		// The lease went to another instance (or Redis stopped
		// answering): what this session reads would reach nobody, and
		// the new holder opens its own. Closed now, not at the next tick.
		if !c.mayKeepSession(w) {
			return
		}
		res, err := p.poll()
		c.polls.Add(1)
		if s.ctx.Err() != nil {
			return // closed meanwhile: not a result
		}
		if err == nil {
			c.judgePoll(r, w, res, at)
			continue
		}
		c.sessionFailed(r, w, s, err, p.closed, at)
		return
	}
}

// judgePoll applies a successful poll: only a change is news.
func (c *Checker) judgePoll(r *run, w *worker, res result, at time.Time) {
	w.trMu.Lock()
	defer w.trMu.Unlock()
	if !w.probing || !w.tr.poll(res, at) {
		return
	}
	c.recorded(r, w, true, false)
}

// sessionFailed judges the end of a session, closed when the connection
// is. A poll that timed out is a failed probe, and the target is probed
// again at once (a dead host sends no reset). A session the server closed
// (it shuts down, crashes, or someone ended the session) is followed at once
// by a probe that takes the target Down when the server refuses or says it
// is going, and changes nothing when it connects. An error on a session
// still open is a failed probe.
func (c *Checker) sessionFailed(r *run, w *worker, s *session, err error, closed bool, at time.Time) {
	// Released first, so that the probe below may open the next session.
	c.release(w, s)
	timeout := isTimeout(err)
	if timeout || !closed {
		w.trMu.Lock()
		if w.probing {
			res := result{cause: pgCause(err, stageReady), detail: bound("role poll: " + err.Error())}
			changed, _ := w.tr.record(res, at)
			c.recorded(r, w, changed, false)
		}
		w.trMu.Unlock()
		if !timeout {
			return
		}
		w.mu.Lock()
		w.owed = true
		w.mu.Unlock()
	} else {
		w.mu.Lock()
		w.urgent = true
		w.mu.Unlock()
		// Said at once, before the probe that tells whether the server
		// is going: a standby promoted meanwhile is then the one primary.
		w.trMu.Lock()
		if w.probing && w.tr.leaving() {
			c.recorded(r, w, true, false)
		}
		w.trMu.Unlock()
	}
	c.ProbeNow(w.t.Key)
}

// going reports whether a probe's cause says the server is not there or is
// going: after a session it ended, such a probe takes the target Down at
// once.
func going(cause string) bool {
	return cause == CauseRefused || cause == CauseShuttingDown || cause == CauseStartingUp
}

// after sets the backoff once a session that lived for lived ended: a
// session that lived past max is opened again as soon as a probe allows,
// a shorter one after a wait doubling from min up to max.
func (b *sessionBackoff) after(lived, min, max time.Duration) {
	if lived >= max {
		b.wait, b.notBefore = 0, time.Time{}
		return
	}
	b.wait = clamp(2*b.wait, min, max)
	b.notBefore = time.Now().Add(b.wait)
}

func clamp(d, lo, hi time.Duration) time.Duration {
	return max(lo, min(d, hi))
}

func (c *Checker) observeSession(delta int) {
	if c.cfg.ObserveSession != nil {
		c.cfg.ObserveSession(delta)
	}
}
