package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// BenchmarkSwitchover measures how long an application cannot write while
// its PostgreSQL primary changes, through pgcluster and, in the same run,
// through libpq's multi-host string, on three real PostgreSQL servers in
// streaming replication checked by a fleet of three bin/coredns instances
// (check postgres, the default interval, rise 2, fall 2, TTL 1 s, checks
// shared through Redis).
//
// Two writers commit an INSERT every 10 ms, each recording when every
// attempt started and ended and which server took it: a discovery.Pool on
// primary.local, and a pgxpool on host=a,b,c target_session_attrs=read-write.
// A poller per instance asks primary.local every 10 ms. The rounds
// alternate a planned switchover (pg_ctl stop -m fast of the primary and
// pg_ctl promote -w of a standby, started together) and an unplanned one
// (SIGKILL of the primary's postmaster, a standby promoted 1 s later); the
// promoted standby is each node in turn. After each round the old primary
// is made a standby of the new one (a fresh pg_basebackup at its address
// and port), the other standby follows the new primary (or is rebuilt too),
// and the next round waits until the rig is steady again. Two last rounds
// promote a standby while the primary keeps running (split brain): first
// with the primary waiting for both standbys to flush every commit
// (synchronous replication, after which the rig is restored), then with
// asynchronous replication as in every other round.
//
// Per round and writer: the outage (the last acknowledgement before the
// first one by the new primary, to that one), the first acknowledgement by
// the new primary after pg_ctl promote -w returned (negative when earlier),
// and failed attempts; per round, from the promotion to every instance
// naming the new primary, and the answers of primary.local that had no
// address (NODATA) or named a server that was not the primary of record.
// A write acknowledged by a server that was not the primary of record
// (switchoverRecord) at any moment of its attempt is a wrong write; a
// write the old primary acknowledged that the new primary lacks is lost
// (replication is asynchronous, and a promotion started with the stop may
// fork before the old primary's last WAL: then the other standby, which
// replayed it, is rebuilt rather than followed, and the round says so).
// Each round begins once the fleet holds a role session per node
// (coredns_pgcluster_check_sessions, waited for up to 10 s, the count
// printed): they open about a second after the answers settle, and a round
// without a session to the promoted node sees the promotion at the check
// interval.
//
// SWITCHOVER_ROUNDS sets the number of rounds of each kind (default 10),
// SWITCHOVER_INTERVAL the fleet's check interval (default: the Corefile's
// default, 2s). b.N is ignored: one run is one measurement.
//
//	go test -run '^$' -bench Switchover -benchtime 1x -timeout 30m ./test/
func BenchmarkSwitchover(b *testing.B) {
	rounds := 10
	if v := os.Getenv("SWITCHOVER_ROUNDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			b.Fatalf("SWITCHOVER_ROUNDS=%q: want a number of rounds of each kind from 1 to 100", v)
		}
		rounds = n
	}
	interval := os.Getenv("SWITCHOVER_INTERVAL")
	if interval != "" {
		if _, err := time.ParseDuration(interval); err != nil {
			b.Fatalf("SWITCHOVER_INTERVAL=%q: want a duration (%v)", interval, err)
		}
	}
	begun := time.Now()
	s := &switchoverRun{rig: startSwitchoverRig(b, interval), record: &switchoverRecord{}}
	s.record.begin(0, begun)
	s.start(b)
	ready := time.Now()
	sessions := s.rig.awaitSessions(switchoverSessionsTimeout)
	fmt.Printf("switchover: bin/coredns and discovery built from %s; rig ready in %v, %d role sessions %v later; check postgres, interval %s, rise 2, fall 2, ttl 1, 3 instances sharing checks through Redis\n",
		switchoverSource(), ready.Sub(begun).Round(time.Millisecond), sessions, time.Since(ready).Round(time.Millisecond), switchoverOr(interval, "2s (default)"))
	fmt.Println(switchoverRoundHeader)

	var results []switchoverRound
	failedInARow := 0
	for i := range 2 * rounds {
		kind := switchoverPlanned
		if i%2 == 1 {
			kind = switchoverUnplanned
		}
		var res switchoverRound
		switch {
		case time.Since(begun) > switchoverBudget:
			res = switchoverRound{kind: kind, n: i/2 + 1, from: -1, to: -1,
				cause: fmt.Sprintf("not run: the rounds passed their budget of %v", switchoverBudget)}
		case failedInARow >= switchoverMaxFailedInARow:
			res = switchoverRound{kind: kind, n: i/2 + 1, from: -1, to: -1,
				cause: fmt.Sprintf("not run: %d rounds failed in a row before it", failedInARow)}
		default:
			res = s.round(kind, i/2+1)
			s.analyse(&res)
		}
		if res.cause != "" {
			failedInARow++
		} else {
			failedInARow = 0
		}
		fmt.Println(res.line())
		results = append(results, res)
	}
	// Two split-brain rounds: first with the primary waiting for both
	// standbys (synchronous replication, the rig restored after it), then
	// with asynchronous replication, which ends the run.
	var splits []switchoverRound
	broken := failedInARow >= switchoverMaxFailedInARow
	for _, kind := range []switchoverKind{switchoverSplitSync, switchoverSplit} {
		if broken {
			splits = append(splits, switchoverRound{kind: kind, from: -1, to: -1, cause: "not run: the rig was broken"})
			continue
		}
		res := s.splitBrain(kind)
		broken = kind == switchoverSplitSync && res.cause != ""
		splits = append(splits, res)
	}
	s.stop()
	var first time.Time // the first split-brain round's promotion
	for i := range splits {
		var until time.Time
		if i+1 < len(splits) {
			until = splits[i+1].fault
		}
		s.analyseSplit(&splits[i], until)
		if first.IsZero() {
			first = splits[i].fault
		}
	}
	wrong := s.wrongWrites(time.Time{}, first)
	s.report(b, results, splits, wrong)
	for _, split := range splits {
		s.splitAfterClosed(split)
	}
}

// splitAfterClosed prints, per writer, the split-brain round's writes that
// the old primary acknowledged in attempts begun after every instance had
// stopped naming a primary. The wrong writes count every write the old
// primary took after the promotion was ordered, which no client can avoid
// entirely (the old primary is the only primary until the promoted one
// leaves recovery, and the fleet's answers follow within a role poll);
// these are the ones a client that follows DNS is to avoid.
func (s *switchoverRun) splitAfterClosed(split switchoverRound) {
	if split.from < 0 || split.promoted.IsZero() || !split.dns.ok {
		return
	}
	closed := split.promoted.Add(split.dns.all)
	for i, w := range s.writers {
		n, last := 0, time.Duration(0)
		for _, a := range w.since(closed) {
			if a.node == split.from {
				n++
				last = a.end.Sub(closed)
			}
		}
		fmt.Printf("  %s, %-11s %d acknowledged by the old primary in attempts begun after every instance stopped naming a primary (%s ms after promote -w returned)%s\n",
			split.kind, switchoverWriterNames[i], n, switchoverMs(split.dns.all), switchoverIf(n > 0, fmt.Sprintf(", the last ending %s ms after that", switchoverMs(last))))
	}
}

func switchoverIf(ok bool, s string) string {
	if ok {
		return s
	}
	return ""
}

// Bounds of the run as a whole.
const (
	// switchoverMaxFailedInARow failed rounds end the rounds: the rig
	// cannot be trusted any more.
	switchoverMaxFailedInARow = 3
	// switchoverBudget is how long rounds keep starting (go test's
	// -timeout is 30m in make bench).
	switchoverBudget = 20 * time.Minute
	// switchoverRoundTimeout bounds the wait, after a promotion, for every
	// instance to name the new primary and both writers to write to it.
	switchoverRoundTimeout = 60 * time.Second
	// switchoverCrashDelay is how long after a crash the standby is promoted.
	switchoverCrashDelay = time.Second
	// switchoverSessionsTimeout bounds the wait, before a round, for the
	// fleet to hold a role session per node: they open a moment after the
	// answers settle (about a second after the fleet's start), and a round
	// begun without one measures the check interval, not the fleet at rest.
	// A fleet that never holds them is measured anyway, the count printed.
	switchoverSessionsTimeout = 10 * time.Second
	// switchoverSplitWatch is how long the split-brain round keeps writing
	// after every instance stopped naming a primary.
	switchoverSplitWatch = 3 * time.Second
)

// switchoverSource names the source the run measures: the commit, and
// "-dirty" when the working tree had changes (others' work in progress).
func switchoverSource() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty").Output()
	if err != nil {
		return "an unknown source (git describe: " + err.Error() + ")"
	}
	return strings.TrimSpace(string(out))
}

func switchoverOr(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// switchoverRun is the rig with its load.
type switchoverRun struct {
	rig     *switchoverRig
	record  *switchoverRecord
	writers []*switchoverWriter
	pollers []*switchoverPoller
	done    chan struct{}
	wg      sync.WaitGroup
	stopped sync.Once
}

// start starts the writers and the pollers, stopped by stop (or when the
// benchmark ends), and waits until both writers write to the primary.
func (s *switchoverRun) start(b *testing.B) {
	s.writers = newSwitchoverWriters(b, s.rig)
	s.done = make(chan struct{})
	for _, w := range s.writers {
		s.wg.Go(func() { w.run(s.done, s.rig.nodeOf) })
	}
	for _, in := range s.rig.ins {
		p := &switchoverPoller{addr: in.Addr()}
		s.pollers = append(s.pollers, p)
		s.wg.Go(func() { p.run(s.done, s.rig.nodeOf) })
	}
	b.Cleanup(s.stop) // before the pools close: cleanups run last first
	from := time.Now()
	if err := s.writing(s.rig.primary, from, 30*time.Second); err != nil {
		b.Fatal(err)
	}
}

// stop stops the writers and the pollers; a second call does nothing.
func (s *switchoverRun) stop() {
	s.stopped.Do(func() { close(s.done) })
	s.wg.Wait()
}

// writing waits until every writer has had a write acknowledged by node
// after from.
func (s *switchoverRun) writing(node int, from time.Time, timeout time.Duration) error {
	return pgtest.WaitFor(timeout, func() error {
		for _, w := range s.writers {
			if !w.ackedOn(node, from) {
				return fmt.Errorf("the %s writer has no write acknowledged by %s", w.name, s.rig.nodes[node].name)
			}
		}
		return nil
	})
}

// named waits until every poller has had an answer naming node alone,
// sent after from.
func (s *switchoverRun) named(node int, from time.Time, timeout time.Duration) error {
	return pgtest.WaitFor(timeout, func() error {
		for _, p := range s.pollers {
			if !p.hasAnswer(from, func(a switchoverAnswer) bool { return a.nodes == 1<<node }) {
				return fmt.Errorf("instance %s has not named %s the primary", p.addr, s.rig.nodes[node].name)
			}
		}
		return nil
	})
}

// ready readies the rig for the round res: steady, both writers writing on
// the primary of record, the fleet's role sessions counted. When it is not,
// res.cause says why and the round is not run.
func (s *switchoverRun) ready(res *switchoverRound) bool {
	r := s.rig
	if err := r.steady(switchoverSteadyTimeout); err != nil {
		res.cause = "the rig was not steady before the round: " + err.Error()
		return false
	}
	if err := s.writing(r.primary, time.Now(), 10*time.Second); err != nil {
		res.cause = "before the round: " + err.Error()
		return false
	}
	res.sessions = r.awaitSessions(switchoverSessionsTimeout)
	return true
}

// round runs one planned or unplanned switchover, from the primary of
// record to the next node, and restores the rig.
func (s *switchoverRun) round(kind switchoverKind, n int) switchoverRound {
	r := s.rig
	res := switchoverRound{kind: kind, n: n, from: r.primary, to: (r.primary + 1) % len(r.nodes)}
	if !s.ready(&res) {
		return res
	}
	old, next := r.nodes[res.from], r.nodes[res.to]
	var err error
	switch kind {
	case switchoverPlanned:
		err = s.planned(&res, old, next)
	case switchoverUnplanned:
		err = s.crash(&res, old, next)
	}
	if err != nil {
		// Without a new primary there is nothing to restore.
		res.cause = err.Error()
		res.restored = time.Now()
		return res
	}
	r.primary = res.to
	// The figures are measured from what the load recorded: wait until it
	// has seen the change, then restore the rig.
	werr := s.writing(res.to, res.fault, switchoverRoundTimeout)
	nerr := s.named(res.to, res.fault, switchoverRoundTimeout)
	if err := errors.Join(werr, nerr); err != nil {
		res.cause = fmt.Sprintf("%v after the promotion: %v", switchoverRoundTimeout, err)
	}
	s.restore(&res)
	res.restored = time.Now()
	return res
}

// restore counts the writes res's old primary acknowledged that the new
// one lacks, then makes the rig steady again around the new primary of
// record: the other standby follows it (or is rebuilt), and the old
// primary is rebuilt as its standby. res.restore says what was done; a
// failure goes to res.cause unless that already says why the round
// failed.
func (s *switchoverRun) restore(res *switchoverRound) {
	r := s.rig
	var err error
	if res.lost, err = s.lost(res); err != nil && res.cause == "" {
		res.cause = "counting lost writes: " + err.Error()
	}
	old, third := r.nodes[res.from], r.nodes[3-res.from-res.to]
	how, err := r.follow(third)
	res.restore = old.name + " rebuilt, " + third.name + " " + how
	if err == nil {
		err = r.rebuild(old)
	}
	if err == nil {
		err = r.steady(switchoverSteadyTimeout)
	}
	if err != nil && res.cause == "" {
		res.cause = "restoring the rig: " + err.Error()
	}
}

// planned stops old (pg_ctl stop -m fast) and promotes next (pg_ctl
// promote -w), both started at once.
func (s *switchoverRun) planned(res *switchoverRound, old, next *switchoverNode) error {
	var (
		wg               sync.WaitGroup
		stopErr, promErr error
		stopped          time.Time
	)
	start := make(chan struct{})
	wg.Go(func() {
		<-start
		stopErr = old.stopFast()
		stopped = time.Now()
	})
	wg.Go(func() {
		<-start
		promErr = next.pg.Promote()
		res.promoted = time.Now()
	})
	res.fault = time.Now()
	res.ordered = res.fault
	s.record.begin(res.to, res.ordered)
	close(start)
	wg.Wait()
	s.record.end(res.from, stopped)
	res.stopped = stopped
	return errors.Join(stopErr, promErr)
}

// crash kills old's postmaster and promotes next switchoverCrashDelay later.
func (s *switchoverRun) crash(res *switchoverRound, old, next *switchoverNode) error {
	res.fault = time.Now()
	err := old.kill()
	res.stopped = time.Now()
	s.record.end(res.from, res.stopped)
	if err != nil {
		return err
	}
	time.Sleep(time.Until(res.fault.Add(switchoverCrashDelay))) // the fault scenario's delay, not a wait for a condition
	res.ordered = time.Now()
	s.record.begin(res.to, res.ordered)
	err = next.pg.Promote()
	res.promoted = time.Now()
	return err
}

// splitBrain promotes the next node while the primary keeps running and
// accepting writes, and watches the writers until every instance has
// stopped naming a primary and switchoverSplitWatch more.
//
// A switchoverSplit round leaves the rig as it is: the run ends. A
// switchoverSplitSync round first has the primary wait for both standbys
// (synchronous_standby_names 'ANY 2', synchronous_commit on): once one of
// them is promoted the old primary acknowledges no commit, whatever the
// clients do. After the watch the old primary is rebuilt as a standby of
// the promoted one, the other standby follows it (or is rebuilt), and the
// rig is steady again, asynchronous as before.
func (s *switchoverRun) splitBrain(kind switchoverKind) switchoverRound {
	r := s.rig
	res := switchoverRound{kind: kind, n: 1, from: r.primary, to: (r.primary + 1) % len(r.nodes)}
	if !s.ready(&res) {
		return res
	}
	if kind == switchoverSplitSync {
		if err := r.synchronous(); err != nil {
			res.cause = "making both standbys synchronous: " + err.Error()
			return res
		}
	}
	writable, err := watchWritable(r.nodes[res.to].pg.DSN(""))
	if err != nil {
		res.cause = "watching the standby's recovery: " + err.Error()
		return res
	}
	res.fault = time.Now()
	res.ordered = res.fault
	s.record.begin(res.to, res.ordered)
	err = r.nodes[res.to].pg.Promote()
	res.promoted = time.Now()
	// Until the promoted server takes writes, the old primary is the only
	// one there is: its tenure ends when the new one's begins for real,
	// not at the order (pg_ctl promote -w returns up to 100 ms after).
	var werr error
	res.writable, werr = writable()
	if werr != nil {
		res.writable = res.ordered // unknown: the earliest it can be
	}
	s.record.end(res.from, res.writable)
	if err != nil || werr != nil {
		res.cause = errors.Join(err, werr).Error()
		res.restored = time.Now()
		return res
	}
	err = pgtest.WaitFor(switchoverRoundTimeout, func() error {
		for _, p := range s.pollers {
			if !p.hasAnswer(res.promoted, func(a switchoverAnswer) bool { return a.nodata }) {
				return fmt.Errorf("instance %s still names a primary", p.addr)
			}
		}
		return nil
	})
	if err != nil {
		res.cause = "split brain never seen: " + err.Error()
	}
	<-time.After(switchoverSplitWatch) // the observation window after it was seen
	res.restored = time.Now()
	if kind != switchoverSplitSync {
		return res
	}

	// The promoted node is the primary of record from here on; whatever
	// the old one still holds is gone with it.
	r.primary = res.to
	s.restore(&res)
	return res
}

// watchWritable polls pg_is_in_recovery() on the standby at dsn back to
// back, from now until it reports false or the returned function is called
// and waited for switchoverRoundTimeout. That function returns the start
// of the last poll that still saw recovery: the earliest moment the server
// can have taken a write, so that no write the old primary acknowledged
// after it passes as right.
func watchWritable(dsn string) (func() (time.Time, error), error) {
	ctx, cancel := context.WithTimeout(context.Background(), switchoverRoundTimeout)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		cancel()
		return nil, err
	}
	type result struct {
		at  time.Time
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer cancel()
		defer conn.Close(context.Background())
		var last time.Time
		for {
			began := time.Now()
			var inRecovery bool
			if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
				done <- result{err: err}
				return
			}
			if !inRecovery {
				done <- result{at: last}
				return
			}
			last = began
		}
	}()
	return func() (time.Time, error) {
		r := <-done
		return r.at, r.err
	}, nil
}

// lost counts, per writer, the writes the old primary acknowledged (from
// 5 s before the fault on) that the new primary does not hold: replication
// is asynchronous, and a promotion does not wait for what the old primary
// had not sent yet.
func (s *switchoverRun) lost(res *switchoverRound) ([]int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.rig.nodes[res.to].pg.DSN(""))
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	var out []int
	for _, w := range s.writers {
		var seqs []int64
		for _, a := range w.since(res.fault.Add(-5 * time.Second)) {
			if a.node == res.from {
				seqs = append(seqs, a.seq)
			}
		}
		var found int
		err := conn.QueryRow(ctx, "SELECT count(DISTINCT seq) FROM switchover_writes WHERE writer = $1 AND seq = ANY($2)", w.name, seqs).Scan(&found)
		if err != nil {
			return nil, err
		}
		out = append(out, len(seqs)-found)
	}
	return out, nil
}

// hasAnswer reports whether the poller has an answer sent after from that
// satisfies ok.
func (p *switchoverPoller) hasAnswer(from time.Time, ok func(switchoverAnswer) bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.answers) - 1; i >= 0 && p.answers[i].sent.After(from); i-- {
		if ok(p.answers[i]) {
			return true
		}
	}
	return false
}
