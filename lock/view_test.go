package lock

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
)

// TestViewMadeAgainMatchesWhole drives a coordinator, without Redis,
// through random sequences of what changes its View (own verdicts, the
// holders' statuses live and read, leases taken, released and lost,
// members coming and going, Claims, local mode and the return, targets
// replaced, and time passing, which lapses statuses) and checks after each
// step that the View made from the last one (only the entries that may
// have changed made again) is the View made whole: an entry that moved
// without being marked would answer from an old verdict until something
// else made the View whole.
//
// Each step checks too that what covered remembers of each target (its
// coverMemo) is what it finds afresh: a memo kept across a change it
// turns on would have the checker leave a target to a holder that no
// longer covers it. With 3 other members a change of the members moves
// most keys (every memo is forgotten); with 15, one member more or less
// moves a few, and only theirs are.
func TestViewMadeAgainMatchesWhole(t *testing.T) {
	for _, others := range []int{3, 15} {
		for seed := range uint64(envInt(t, "VIEW_SEEDS", 20)) { // VIEW_SEEDS: more walks, to search
			t.Run(fmt.Sprintf("%d/%d", others, seed), func(t *testing.T) { viewRandomWalk(t, seed, others) })
		}
	}
}

func viewRandomWalk(t *testing.T, seed uint64, n int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	c := offlineCoordinator(t, Config{Prefix: "p:", Interval: 2 * time.Second, Timeout: 500 * time.Millisecond})
	var others []string
	for i := range n {
		others = append(others, fmt.Sprintf("%032x", i+1))
	}
	all := make([]health.Target, 40)
	for i := range all {
		all[i] = health.Target{Key: fmt.Sprintf("c%d/n%d", i/2, i%2), Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 1, byte(i)}), 5432)}
	}
	targets := all[:30]
	c.SetTargets(targets)
	members := func() Membership {
		m := Membership{Members: []string{c.Token()}, Now: time.Now().Add(c.offset)}
		// Most often one member more or less than the last round's.
		flip := -1
		if rng.IntN(3) != 0 {
			flip = rng.IntN(len(others))
		}
		for i, o := range others {
			live := c.members[o]
			if flip < 0 {
				live = rng.IntN(4) != 0
			} else if i == flip {
				live = !live
			}
			if live {
				m.Members = append(m.Members, o)
			}
		}
		slices.Sort(m.Members)
		return m
	}
	c.round(members())
	progress := func() health.Progress {
		switch rng.IntN(6) {
		case 0:
			return upFailing(1) // on its way down
		case 1:
			return downRising(1) // on its way up
		}
		if rng.IntN(3) == 0 {
			return down(2)
		}
		return health.Progress{Verdict: health.Verdict{State: health.Up, Cause: health.CauseOK, Role: []string{"primary", "standby"}[rng.IntN(2)], Last: time.Now()}, OK: 2}
	}
	var steps []string
	for step := range 400 {
		tg := all[rng.IntN(len(all))]
		switch op := rng.IntN(13); op {
		case 0, 1, 2:
			steps = append(steps, "record "+tg.Key)
			c.Record(tg, progress())
		case 3, 4, 5:
			// A holder's status, live or from a read, by anyone the
			// fleet may or may not give the key to.
			holder := append(others, c.Token())[rng.IntN(len(others)+1)]
			st := newStatus(tg.Addr, holder, time.Now(), progress())
			c.mu.Lock()
			v := c.now() - rng.Int64N(int64(3*time.Second/time.Microsecond))
			c.mu.Unlock()
			st.V = v
			live := rng.IntN(2) == 0
			steps = append(steps, fmt.Sprintf("status %s by %.4s live %v", tg.Key, holder, live))
			c.applyRemote(tg.Key, v, encode(c.cfg.macKey(tg.Key), st, c.cfg.Secret), live)
		case 6:
			steps = append(steps, "claim "+tg.Key)
			c.Claim(tg)
		case 7:
			// Leases taken and released as tend does, or one lost as a
			// fenced write finds.
			c.mu.Lock()
			if rng.IntN(2) == 0 {
				steps = append(steps, "lease lost "+tg.Key)
				if c.held[tg.Key] {
					delete(c.held, tg.Key)
					c.signalKey(tg.Key)
				}
			} else {
				steps = append(steps, "leases taken and released")
				for _, t := range targets {
					if rng.IntN(3) == 0 {
						if c.owners[t.Key] == c.Token() {
							c.held[t.Key] = true
						} else {
							delete(c.held, t.Key)
						}
						c.touch(t.Key) // as tend does: a lease that moved touches its key
					}
				}
				c.wakeView()
			}
			c.mu.Unlock()
		case 8:
			steps = append(steps, "round")
			c.round(members())
		case 9:
			steps = append(steps, "local")
			c.mu.Lock()
			c.goLocal()
			c.mu.Unlock()
		case 10:
			d := time.Duration(rng.Int64N(int64(3 * time.Second)))
			steps = append(steps, fmt.Sprintf("%v pass", d))
			c.mu.Lock()
			c.offset += d
			c.mu.Unlock()
		case 12:
			// A heartbeat finds nothing a holder published missing
			// here: its statuses are current as of now (see asOf).
			o := others[rng.IntN(len(others))]
			steps = append(steps, fmt.Sprintf("feed of %.4s confirmed", o))
			c.mu.Lock()
			f := c.feeds[o]
			if f == nil {
				f = &feed{numbers: true}
				c.feeds[o] = f
			}
			f.confirmed = max(f.confirmed, c.now())
			c.mu.Unlock()
		case 11:
			if rng.IntN(4) == 0 {
				lo := rng.IntN(10)
				targets = all[lo : lo+30]
				steps = append(steps, "targets replaced")
				c.SetTargets(targets)
			}
		}
		if diff := coverDiff(c, targets); len(diff) > 0 {
			t.Fatalf("step %d: what covered remembers is not what it finds afresh (%s); the last steps: %q", step, strings.Join(diff, "; "), steps[max(0, len(steps)-6):])
		}
		c.mu.Lock()
		before := c.now()
		c.mu.Unlock()
		got := c.view()
		c.mu.Lock()
		c.signalAll()
		c.mu.Unlock()
		want := c.view()
		// A cover that lapsed between the two Views (a handover's
		// lapses seconds after its status's write, and time passes here
		// as the walk runs) is no missed change: only an entry whose
		// cover was the same at both moments must agree.
		c.mu.Lock()
		after := c.now()
		c.mu.Unlock()
		turned := func(k string) bool {
			c.mu.Lock()
			defer c.mu.Unlock()
			addr, ok := c.targets[k]
			return ok && c.coveredAt(k, addr, before) != c.coveredAt(k, addr, after)
		}
		if diff := viewDiff(got, want, turned); len(diff) > 0 {
			t.Fatalf("step %d: the View made again is not the View made whole (%s); the last steps: %q", step, strings.Join(diff, "; "), steps[max(0, len(steps)-6):])
		}
	}
}

// coverDiff names the targets for which covered, with c's coverMemos,
// answers otherwise than without them.
func coverDiff(c *Coordinator, targets []health.Target) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	var out []string
	for _, tg := range targets {
		got := c.coveredAt(tg.Key, tg.Addr, now)
		kept := c.covers
		c.covers = map[string]coverMemo{}
		want := c.coveredAt(tg.Key, tg.Addr, now)
		c.covers = kept
		if got != want {
			out = append(out, fmt.Sprintf("%s: remembered %v, found %v", tg.Key, got, want))
		}
	}
	return out
}

// viewDiff names the entries in which got differs from want, the time of
// the probe included, but for those of the keys skip names.
func viewDiff(got, want health.View, skip func(key string) bool) []string {
	var out []string
	for k, w := range want.All() {
		if skip(k) {
			continue
		}
		if g, ok := got.Get(k); !ok || !g.Equal(w, true) || !g.Last.Equal(w.Last) {
			out = append(out, fmt.Sprintf("entry %s: made again %+v, made whole %+v", k, g, w))
		}
	}
	for k, g := range got.All() {
		if _, ok := want.Get(k); !ok && !skip(k) {
			out = append(out, fmt.Sprintf("entry %s: made again %+v, made whole none", k, g))
		}
	}
	return out
}

// offlineCoordinator is a coordinator whose Redis is never dialled: the
// test or benchmark drives its state itself.
func offlineCoordinator(tb testing.TB, cfg Config) *Coordinator {
	tb.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	tb.Cleanup(func() { rdb.Close() })
	c, err := NewCoordinator(rdb, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// TestViewHolderLapses: a target this instance probed and does not hold,
// covered by its holder's status, answers from this instance's own verdict
// once that status lapses, though nothing here changed but the time.
func TestViewHolderLapses(t *testing.T) {
	c, other, tg, _ := pairedCoordinator(t)
	probedDownHolderUp(c, other, tg)
	if v := c.view(); v.At(tg.Key).State != health.Up {
		t.Fatalf("while the holder's status covers %s, the View has %v, want its Up", tg.Key, v.At(tg.Key).State)
	}
	c.mu.Lock()
	c.offset += c.b.cover() + time.Second
	c.mu.Unlock()
	if v := c.view(); v.At(tg.Key).State != health.Down {
		t.Fatalf("once the holder's status lapsed, the View has %v for %s, want this instance's own Down", v.At(tg.Key).State, tg.Key)
	}
}

// TestViewReturnNoFlapBack: after an outage, each instance comes back with
// the verdicts it found in local mode, counted on its own, and its holder's
// first status may still be on its way to the same conclusion. A backend
// stopped during the outage, found Down here (fall reached) and Up with one
// failed probe by its holder, stays Down here: the holder's last probe
// failed too, so answering its Up would bring a stopped backend back for
// up to (fall - 1) intervals, though nothing here or there saw it answer.
// Once the holder's verdict reaches Down, or its probe succeeds, the
// holder's counts. Not the other way round: a backend back, Up here and
// Down on its way up at its holder, waits for the holder's rise, with the
// holder's newer reading of it.
func TestViewReturnNoFlapBack(t *testing.T) {
	for _, tc := range []struct {
		name        string
		own, holder health.Progress
		want        health.State // while the holder's status is the first after the return
	}{
		{"stopped: holder on its way down", down(2), upFailing(1), health.Down},
		{"stopped: holder down too", down(2), down(2), health.Down},
		{"stopped: holder probed it answering", down(2), up(1), health.Up},
		{"back: holder on its way up", up(2), downRising(1), health.Down},
		{"back: holder probed it refusing", up(2), down(1), health.Down},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, other, tg, m := pairedCoordinator(t)
			// The outage: this instance probes everything itself.
			c.mu.Lock()
			c.goLocal()
			c.mu.Unlock()
			c.Claim(tg)
			c.Record(tg, tc.own)
			if v := c.view(); v.At(tg.Key).State != tc.own.Verdict.State {
				t.Fatalf("in local mode the View has %v for %s, want this instance's own %v", v.At(tg.Key).State, tg.Key, tc.own.Verdict.State)
			}
			// The return, then the holder's first status, published.
			c.mu.Lock()
			c.offset += time.Second
			c.mu.Unlock()
			m.Now = time.Now().Add(c.offset)
			c.round(m)
			st := newStatus(tg.Addr, other, time.Now(), tc.holder)
			c.mu.Lock()
			st.V = c.now()
			c.mu.Unlock()
			c.applyRemote(tg.Key, st.V, encode(c.cfg.macKey(tg.Key), st, c.cfg.Secret), true)
			if v := c.view(); v.At(tg.Key).State != tc.want {
				t.Fatalf("after the return, with the holder's %v (ok %d, fail %d) against this instance's own %v, the View has %v, want %v",
					tc.holder.Verdict.State, tc.holder.OK, tc.holder.Fail, tc.own.Verdict.State, v.At(tg.Key).State, tc.want)
			}
			// This instance's next tick leaves the target to its holder;
			// the View must not change for it.
			c.Claim(tg)
			if v := c.view(); v.At(tg.Key).State != tc.want {
				t.Fatalf("after this instance's next tick, the View has %v for %s, want %v still", v.At(tg.Key).State, tg.Key, tc.want)
			}
			// The holder's next probe decides.
			next := tc.holder
			next.Verdict.Last = time.Now()
			switch {
			case tc.holder.Verdict.State == health.Up && tc.holder.Fail > 0:
				next = down(2)
			case tc.holder.Verdict.State == health.Down && tc.holder.OK > 0:
				next = up(2)
			}
			st = newStatus(tg.Addr, other, time.Now(), next)
			c.mu.Lock()
			st.V = c.now() + 1
			c.mu.Unlock()
			c.applyRemote(tg.Key, st.V, encode(c.cfg.macKey(tg.Key), st, c.cfg.Secret), true)
			if v := c.view(); v.At(tg.Key).State != next.Verdict.State {
				t.Fatalf("with the holder's next status %v, the View has %v for %s", next.Verdict.State, v.At(tg.Key).State, tg.Key)
			}
		})
	}
}

// TestViewReturnLateMessage: a status its holder published before the
// outage, delivered only after this instance came back (Redis stopped
// between running the PUBLISH and writing it out, and wrote it out when
// it resumed), does not cover its target: this instance answers from what
// it found in local mode until the holder writes again.
func TestViewReturnLateMessage(t *testing.T) {
	c, other, tg, m := pairedCoordinator(t)
	status := func(p health.Progress, v int64) {
		st := newStatus(tg.Addr, other, time.Now(), p)
		st.V = v
		c.applyRemote(tg.Key, v, encode(c.cfg.macKey(tg.Key), st, c.cfg.Secret), true)
	}
	c.mu.Lock()
	before := c.now()
	c.offset += time.Second
	c.goLocal()
	c.mu.Unlock()
	status(up(2), before-1000) // received before the outage
	c.Claim(tg)
	c.Record(tg, down(2))
	c.mu.Lock()
	c.offset += 10 * time.Second
	c.mu.Unlock()
	m.Now = time.Now().Add(c.offset)
	c.round(m)            // the return
	status(up(2), before) // published before the outage, received now
	if v := c.view(); v.At(tg.Key).State != health.Down {
		t.Fatalf("a status published before the outage and received after the return covers %s: the View has %v, want this instance's own Down", tg.Key, v.At(tg.Key).State)
	}
	c.mu.Lock()
	now := c.now()
	c.mu.Unlock()
	status(up(2), now) // the holder writes again
	if v := c.view(); v.At(tg.Key).State != health.Up {
		t.Fatalf("the holder's status written after the return does not cover %s: the View has %v, want its Up", tg.Key, v.At(tg.Key).State)
	}
}

// pairedCoordinator returns an offline coordinator in a fleet of two
// members, itself and other (m), over 8 targets, and a target the fleet
// gives to other.
func pairedCoordinator(t *testing.T) (c *Coordinator, other string, tg health.Target, m Membership) {
	t.Helper()
	c = offlineCoordinator(t, Config{Prefix: "p:", Interval: 2 * time.Second, Timeout: 500 * time.Millisecond})
	other = fmt.Sprintf("%032x", 1)
	var ts []health.Target
	for i := range 8 {
		ts = append(ts, health.Target{Key: fmt.Sprintf("c%d/n0", i), Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 1, byte(i)}), 5432)})
	}
	c.SetTargets(ts)
	m = Membership{Members: []string{c.Token(), other}, Now: time.Now()}
	c.round(m)
	for _, x := range ts {
		if c.ownerOf(x.Key) == other {
			tg = x
		}
	}
	if tg.Key == "" {
		t.Fatal("no target of the other member's among 8")
	}
	return c, other, tg, m
}

// Progress of a target as a checker with rise 2, fall 2 counts it.
func down(fail int) health.Progress {
	return health.Progress{Verdict: health.Verdict{State: health.Down, Cause: health.CauseRefused, Detail: "refused", Last: time.Now()}, Fail: fail}
}

func up(ok int) health.Progress {
	return health.Progress{Verdict: health.Verdict{State: health.Up, Cause: health.CauseOK, Last: time.Now()}, OK: ok}
}

// upFailing is Up with fail failed probes since (fewer than fall).
func upFailing(fail int) health.Progress {
	p := up(0)
	p.Fail = fail
	return p
}

// downRising is Down with ok good probes since (fewer than rise).
func downRising(ok int) health.Progress {
	p := down(0)
	p.OK = ok
	return p
}

// A read that finds a key's stored status too old to count (a holder's
// rewrite came late) but newer than the status applied here (whose newer
// message never came: a subscription made again on a loaded machine)
// replaces the older one, which its holder's heartbeats would go on
// vouching for, and the key is read again once its holder has rewritten
// it.
func TestReadOlderThanTrustedButNewerReplaces(t *testing.T) {
	c, other, tg, _ := pairedCoordinator(t)
	c.mu.Lock()
	now := c.now()
	c.mu.Unlock()
	old := c.b.storedAge().Microseconds()
	unknown := newStatus(tg.Addr, other, time.Now(), health.Progress{})
	unknown.V = now - old - 2_000_000
	c.applyRemote(tg.Key, unknown.V, encode(c.cfg.macKey(tg.Key), unknown, c.cfg.Secret), true)
	c.mu.Lock()
	_, had := c.remote[tg.Key]
	c.mu.Unlock()
	if !had {
		t.Fatal("the live status was not applied")
	}

	// Older than trusted, and older than what is applied: dropped, the
	// applied one kept.
	older := newStatus(tg.Addr, other, time.Now(), up(2))
	older.V = unknown.V - 1
	c.applyRemote(tg.Key, older.V, encode(c.cfg.macKey(tg.Key), older, c.cfg.Secret), false)
	c.mu.Lock()
	r, had := c.remote[tg.Key]
	_, reread := c.rereads[tg.Key]
	c.mu.Unlock()
	if !had || r.version != unknown.V || reread {
		t.Fatalf("an older read status changed what is applied (had %v, reread %v)", had, reread)
	}

	newer := newStatus(tg.Addr, other, time.Now(), up(2))
	newer.V = unknown.V + 1_000_000 // still older than storedAge
	c.applyRemote(tg.Key, newer.V, encode(c.cfg.macKey(tg.Key), newer, c.cfg.Secret), false)
	c.mu.Lock()
	r, had = c.remote[tg.Key]
	at, reread := c.rereads[tg.Key]
	c.mu.Unlock()
	if !had || r.version != newer.V {
		t.Error("a read status newer than the applied one, too old to trust alone, left the older one applied")
	}
	if !reread || time.Until(at) < c.b.rewrite() {
		t.Errorf("the key is not read again after its holder's rewrite (reread %v, in %v)", reread, time.Until(at))
	}
	c.mu.Lock()
	c.mode = ModeCoordinated
	c.mu.Unlock()

	// Due: the next read is of that key.
	c.mu.Lock()
	c.rereads[tg.Key] = time.Now().Add(-time.Millisecond)
	c.mu.Unlock()
	j, ok := c.nextRead()
	if !ok || j.all || !slices.Equal(j.keys, []string{tg.Key}) {
		t.Errorf("the read due is %+v (%v), want the key alone", j, ok)
	}
	// A read of it that fails is tried again.
	c.retry(j)
	c.mu.Lock()
	_, reread = c.rereads[tg.Key]
	c.mu.Unlock()
	if !reread {
		t.Error("a failed read of the key is not tried again")
	}
}

// TestViewDueWhenOwnMayChange: the View loop is told when the entry of a
// target this instance probed and does not hold may change by time alone
// (its holder's status stops covering it, or comes to), since nothing else
// wakes it then: an instance that stopped probing a target its holder
// covers would otherwise answer its own unfinished verdict for as long as
// nothing else changed (measured: 49 of 10,000 targets missing from a new
// instance's View for over a minute).
func TestViewDueWhenOwnMayChange(t *testing.T) {
	c, other, tg, _ := pairedCoordinator(t)
	c.view()
	if d, ok := c.untilOwnDue(); ok {
		t.Fatalf("nothing probed here, yet a View is due in %v", d)
	}
	probedDownHolderUp(c, other, tg)
	if v := c.view(); v.At(tg.Key).State != health.Up {
		t.Fatalf("covered by the holder's status: %v, want its Up", v.At(tg.Key).State)
	}
	d, ok := c.untilOwnDue()
	if !ok || d <= 0 || d > c.b.cover()+time.Second {
		t.Fatalf("covered until the holder's status lapses (%v): a View due in %v (%v), want within that", c.b.cover(), d, ok)
	}
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
	if d, ok := c.untilOwnDue(); !ok || d > time.Millisecond {
		t.Fatalf("once the cover lapsed: a View due in %v (%v), want at once", d, ok)
	}
	if v := c.view(); v.At(tg.Key).State != health.Down {
		t.Fatalf("the holder's status lapsed: %v, want this instance's own Down", v.At(tg.Key).State)
	}
	// Uncovered: a status confirmed again may cover it, so it is looked
	// at again an interval on.
	if d, ok := c.untilOwnDue(); !ok || d > c.b.interval+time.Millisecond || d < c.b.interval/2 {
		t.Fatalf("uncovered: a View due in %v (%v), want in an interval (%v)", d, ok, c.b.interval)
	}
}

// probedDownHolderUp has c find tg down itself, then hear its holder
// other's Up, written now.
func probedDownHolderUp(c *Coordinator, other string, tg health.Target) {
	c.Record(tg, down(2))
	st := newStatus(tg.Addr, other, time.Now(), up(2))
	c.mu.Lock()
	st.V = c.now()
	c.mu.Unlock()
	c.applyRemote(tg.Key, st.V, encode(c.cfg.macKey(tg.Key), st, c.cfg.Secret), true)
}
