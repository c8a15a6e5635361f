package test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// The chaos run's registry is a primary and its streaming standby, one on
// each of these addresses; a fail-over swaps which is which.
var chaosRegistryHosts = [2]string{"127.0.0.81", "127.0.0.82"}

// chaosRegistrySettings are both servers' settings: a standby whose
// primary restarted (PostgreSQL stopped and started) retries streaming
// within this, not PostgreSQL's default 5 s, so that a fail-over soon
// after finds it caught up.
var chaosRegistrySettings = map[string]string{"wal_retrieve_retry_interval": "200ms"}

// startRegistry starts the registry's primary, with the schema, and a
// streaming standby of it. Whichever servers exist when the test ends are
// closed then.
func (r *chaosRun) startRegistry() {
	pg, err := pgtest.Start(pgtest.Options{Host: chaosRegistryHosts[0], Settings: chaosRegistrySettings})
	if err != nil {
		r.t.Fatalf("this test needs a real PostgreSQL server and could not start one: %v", err)
	}
	r.pg = pg
	r.t.Cleanup(r.closeRegistry)
	r.pg.MustExec(r.t, pgcluster.Schema)
	r.standby = r.newStandby(chaosRegistryHosts[1], 0)
}

// newStandby makes a streaming standby of the primary on host and port (0:
// a free one).
func (r *chaosRun) newStandby(host string, port int) *pgtest.Postgres {
	s, err := pgtest.StartStandby(r.pg, pgtest.Options{Host: host, Port: port, Settings: chaosRegistrySettings})
	if err != nil {
		r.t.Fatalf("this test needs a PostgreSQL standby of the registry and could not make one: %v", err)
	}
	return s
}

// closeRegistry closes the registry's servers, whichever they are now.
func (r *chaosRun) closeRegistry() {
	for _, p := range []*pgtest.Postgres{r.pg, r.standby} {
		if p != nil {
			p.Close()
		}
	}
}

// registryDSN names both servers, the primary first, as a multi-host DSN
// that connects to whichever accepts writes: after a fail-over the fleet
// finds the promoted standby through it, without a restart.
func (r *chaosRun) registryDSN() string {
	return fmt.Sprintf("host=%s,%s port=%d,%d user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write connect_timeout=2",
		r.pg.Host, r.standby.Host, r.pg.Port, r.standby.Port)
}

// chaosFailover is what the fleet took to follow a registry fail-over.
type chaosFailover struct {
	// promoted is from the primary's stop to the standby's promotion
	// (pg_ctl promote -w returned), after every instance noticed the stop.
	promoted time.Duration
	// up is from the promotion until registry_up is 1 again, on the first
	// instance and on every one: the fleet follows the new primary.
	up chaosNoticed
	// answered is from the COMMIT of a role swap on the new primary (made
	// after the new standby) until every instance answered primary. with
	// the node that swap made primary.
	answered time.Duration
}

// failover fails the registry over to its standby: once the standby has
// replayed all the primary wrote (nothing committed is lost), the primary
// is stopped at once, as by a crash, and, once every instance noticed,
// the standby is promoted. When every instance follows the new primary,
// a new standby of it is made at the old primary's address and port, so
// that the DSN's two hosts stay valid and the next fail-over goes the
// other way; then a role swap is committed on the new primary and the
// script waits until every instance answers it.
func (r *chaosRun) failover() {
	r.caughtUp()
	old := r.pg
	from := time.Now()
	if err := old.Stop(); err != nil {
		r.t.Fatal(err)
	}
	noticed := r.untilAll(from, registryUp, 0)
	if err := r.standby.Promote(); err != nil {
		r.t.Fatal(err)
	}
	promoted := time.Now()
	r.pg, r.standby = r.standby, nil
	old.Close()
	r.event("registry: %s stopped, %s promoted", old.HostPort(), r.pg.HostPort())
	up := r.untilAll(promoted, registryUp, 1)
	r.standby = r.newStandby(old.Host, old.Port)
	r.event("registry: %s streams from %s", r.standby.HostPort(), r.pg.HostPort())
	answered := r.swapAnswered()
	r.windows = append(r.windows, chaosWindow{what: "registry failed over", from: from, to: time.Now(), noticed: noticed,
		failover: &chaosFailover{promoted: promoted.Sub(from), up: up, answered: answered}})
}

// caughtUp waits until the standby has replayed the primary's WAL up to
// its current position.
func (r *chaosRun) caughtUp() {
	r.t.Helper()
	caughtUp(r.t, r.pg, r.standby, chaosStepTimeout)
}

// caughtUp waits up to timeout until standby has replayed primary's WAL up
// to its current position: nothing committed on the primary is lost with it.
func caughtUp(t testing.TB, primary, standby *pgtest.Postgres, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	Eventually(t, timeout, func() error {
		want, err := primary.CurrentLSN(ctx)
		if err != nil {
			return err
		}
		got, err := standby.ReplayLSN(ctx)
		if err != nil {
			return err
		}
		if got < want {
			return fmt.Errorf("the standby %s replayed up to %d, the primary %s is at %d", standby.HostPort(), got, primary.HostPort(), want)
		}
		return nil
	})
}
