package test

import (
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/coretest"
)

// Attack 7: a second fleet (B) with the same zone, so the same default
// prefix, on the same Redis, serving another registry (a database of its
// own on the same PostgreSQL server, where prod → staging): first with
// the rig's secret, then with another. Whoever holds the registry lease,
// each fleet serves its own registry, fleet A still takes a stopped
// backend and an unhealthy node out within the bound, and the shared
// prefix is logged.
func attackTwoFleets(t *testing.T, a *attackRun) {
	r := a.rig
	ctx := a.ctx()
	r.pg.MustExec(t, "CREATE DATABASE staging")
	conn := pgConnect(ctx, t, r.pg.DSN("staging"))
	mustExec(ctx, t, conn, pgcluster.Schema)
	s0 := openFleetBackend(t, "127.0.0.91")
	mustExec(ctx, t, conn, fmt.Sprintf("INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES ('staging', 's0', '%s', %s, 'primary');"+
		" INSERT INTO pgcluster_aliases(alias, target) VALUES ('prod', 'staging')", s0.host, s0.port))
	staging := []string{s0.host}
	var gone []int // fleet A's nodes taken out so far

	for _, part := range []struct {
		name, secret string
		out          func(int)
		node         int
	}{
		{"the same secret", r.secret, a.stop, 1},
		{"another secret", coretest.RandomHex(24), a.unhealthy, 2},
	} {
		marks := logMarks(r.ins)
		b := startTogether(t, r.corefileOf(r.pg.DSN("staging"), part.secret), 2)
		bFollows := a.fleetBFollows(b)
		t.Logf("%s: an instance of fleet B follows the registry lease: %v", part.name, bFollows)
		// The leases fleetBFollows took away are its doing, not the
		// attack's: fleet A's log counts from here, for each part.
		a.start, a.marks = time.Now(), logMarks(r.ins)
		Eventually(t, attackBound+attackMargin, func() error {
			if err := prodAnswers(r.ins, hostsBut(gone...))(); err != nil {
				return fmt.Errorf("fleet A: %w", err)
			}
			if err := prodAnswers(b, staging)(); err != nil {
				return fmt.Errorf("fleet B: %w", err)
			}
			return nil
		})
		holdsFor(t, 2*time.Second, part.name+": each fleet its registry", func() error {
			if err := prodAnswers(r.ins, hostsBut(gone...))(); err != nil {
				return fmt.Errorf("fleet A: %w", err)
			}
			return prodAnswers(b, staging)()
		})
		part.out(part.node)
		gone = append(gone, part.node)
		if err := prodAnswers(b, staging)(); err != nil {
			t.Errorf("%s: fleet B, once fleet A's node n%d went: %v", part.name, part.node, err)
		}
		// The shared prefix is found and said, by one fleet or the other.
		Eventually(t, 10*time.Second, func() error {
			for i, in := range append(slices.Clone(r.ins), b...) {
				from := 0
				if i < len(marks) {
					from = marks[i]
				}
				if sharedPrefixLine.MatchString(in.Log()[from:]) {
					return nil
				}
			}
			return fmt.Errorf("%s: no instance of either fleet logged that another fleet shares its redis_prefix", part.name)
		})
		a.logBounded(r.ins, a.marks)
		a.logBounded(b, []int{0, 0})
		a.start, a.marks = time.Now(), logMarks(r.ins)
		for _, in := range b {
			if err := in.Term(); err != nil {
				t.Error(err)
			}
		}
	}
	a.newcomer(1, 2)
}

// sharedPrefixLine is a warning about the prefix: what an operator reads
// when two fleets share one.
var sharedPrefixLine = regexp.MustCompile(`(?im)^\[WARNING\].*prefix`)

// fleetBFollows gives fleet B the registry lease, as a restart of fleet
// A's follower would: the attacker deletes it until an instance of b
// takes it (for up to 10 s), and reports whether one did.
func (a *attackRun) fleetBFollows(b []*Instance) bool {
	a.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if slices.Contains(roles(a.t, b), "follower") {
			return true
		}
		a.do("DEL", registryLeaseKey)
		time.Sleep(relayTickForTests)
	}
	return false
}

// relayTickForTests is the relay's poll (relay.go's relayTick), with its
// jitter: the time for a free registry lease to be taken.
const relayTickForTests = 700 * time.Millisecond

// prodAnswers checks that every instance of ins answers prod.<Zone> with
// exactly hosts (behind the alias's CNAME).
func prodAnswers(ins []*Instance, hosts []string) func() error {
	want := slices.Sorted(slices.Values(hosts))
	return func() error {
		for _, in := range ins {
			m, err := Exchange("udp", in.Addr(), attackAlias, dns.TypeA)
			if err != nil {
				return err
			}
			if got := Addrs(m); m.Rcode != dns.RcodeSuccess || !slices.Equal(got, want) {
				return fmt.Errorf("%s answers %s %s %v, want %v", in.Addr(), attackAlias, dns.RcodeToString[m.Rcode], got, want)
			}
		}
		return nil
	}
}
