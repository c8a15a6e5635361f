package lock

import (
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// A fleet keeps one session per node, held by the node's lease holder, and
// none while Redis is down (every instance then probes every node, and
// sessions would multiply by the instances). A promotion read on the
// holder's session reaches every instance's View through Redis long before
// the next probe of a 10 s Interval, with its timeline and system
// identifier.
func TestCoordinatorSessionsOnePerNode(t *testing.T) {
	primary := pgtest.New(t)
	standby := pgtest.NewStandby(t, primary)
	addr := func(p *pgtest.Postgres) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(p.Port))
	}
	targets := []health.Target{{Key: "c/primary", Addr: addr(primary)}, {Key: "c/standby", Addr: addr(standby)}}
	srv := redistest.Start(t)
	const interval = 10 * time.Second
	var ins []*pgInstance
	for range 3 {
		ins = append(ins, startPGInstance(t, newClient(t, srv), targets, interval))
	}
	sessions := func() (total int32, each []int32) {
		for _, in := range ins {
			n := in.sessions.Load()
			total += n
			each = append(each, n)
		}
		return total, each
	}
	// Settled, not only one session per node: each node's lease held by
	// the instance the fleet of three gives it to. (The first instance
	// takes every lease while it is alone and holds two sessions, one
	// per node, before it knows the others; were the promotion to come
	// while the standby's lease moves, no session would be open to see
	// it, and the next probe is an Interval away.)
	settled := func() bool {
		total, _ := sessions()
		if total != int32(len(targets)) {
			return false
		}
		var tokens []string
		for _, in := range ins {
			tokens = append(tokens, in.coord.Token())
		}
		slices.Sort(tokens)
		for _, in := range ins {
			if in.coord.Mode() != ModeCoordinated || int(in.sessions.Load()) != len(in.coord.Held()) {
				return false
			}
			for _, tg := range targets {
				if (owner(tokens, tg.Key) == in.coord.Token()) != slices.Contains(in.coord.Held(), tg.Key) {
					return false
				}
			}
		}
		return true
	}
	eventually(t, 30*time.Second, "one session per node, each held by the instance the fleet gives the node to", settled)
	eventually(t, 30*time.Second, "every instance sees the standby up as a standby", func() bool {
		for _, in := range ins {
			if v := in.verdict("c/standby"); v.State != health.Up || v.Role != health.RoleStandby {
				return false
			}
		}
		return true
	})
	// Still settled when the promotion comes: a lease that moved since
	// (a loaded machine) has its session reopened first.
	eventually(t, 30*time.Second, "still one session per node, held by the node's owner, before the promotion", settled)

	begun := time.Now()
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "every instance sees the promotion, on timeline 2", func() bool {
		for _, in := range ins {
			if v := in.verdict("c/standby"); v.Role != health.RolePrimary || v.Timeline != 2 || v.SystemID == 0 {
				return false
			}
		}
		return true
	})
	t.Logf("every instance saw the promotion %v after pg_ctl promote began (Interval %v)", time.Since(begun).Round(time.Millisecond), interval)

	srv.Stop()
	eventually(t, 30*time.Second, "no session in local mode", func() bool {
		for _, in := range ins {
			if in.coord.Mode() != ModeLocal {
				return false
			}
		}
		total, _ := sessions()
		return total == 0
	})
	if _, each := sessions(); fmt.Sprint(each) != "[0 0 0]" {
		t.Errorf("sessions per instance in local mode: %v, want none", each)
	}
}

// pgInstance is a fleet member with the postgres check, counting its
// sessions.
type pgInstance struct {
	*instance
	sessions atomic.Int32
}

func (in *pgInstance) verdict(key string) health.Verdict {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.view.At(key)
}

// startPGInstance starts a fleet member on rdb with the postgres check of
// targets every interval, until the test ends.
func startPGInstance(t *testing.T, rdb redis.UniversalClient, targets []health.Target, interval time.Duration) *pgInstance {
	t.Helper()
	in := &pgInstance{}
	in.instance = startChecked(t, rdb, targets,
		Config{Prefix: "fleet:", Interval: interval, Timeout: 500 * time.Millisecond, Resync: time.Second, Logf: t.Logf},
		health.Config{Check: health.CheckPostgres, Options: "user=postgres dbname=postgres sslmode=disable",
			Interval: interval, Timeout: 500 * time.Millisecond, Rise: 1, Fall: 2, RoleInterval: 50 * time.Millisecond,
			ObserveSession: func(d int) { in.sessions.Add(int32(d)) }})
	return in
}
