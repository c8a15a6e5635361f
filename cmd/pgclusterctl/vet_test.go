package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// status vets what it reads from Redis as the instances do. Against a
// fleet of two instances with a secret, an attacker without it adds fifty
// members far in the future and fifty kept within the bounds: status
// lists neither as live, only the two instances, and says it refused
// them. The attacker then stops pg2 and writes its genuine status again
// and again, captured while pg2 was up and now older than the bound (a
// resync, a lease and an interval): every instance has pg2 out, and status
// never says in: the replayed status is stale (check_stale, unknown), or
// the holder's own, down, when status reads between two replays.
func TestStatusVetsAsTheFleet(t *testing.T) {
	const secret = "0123456789abcdef-pgclusterctl-vet"
	t.Setenv(secretEnv, secret)
	reg := registry(t)
	pg1, pg2 := newBackend(t, "127.0.0.81"), newBackend(t, "127.0.0.82")
	reg.MustExec(t, `INSERT INTO pgcluster_nodes (cluster, name, address, port, role) VALUES
		('local', 'pg1', $1, $2, 'primary'), ('local', 'pg2', $3, $4, 'standby')`,
		pg1.host, pg1.port, pg2.host, pg2.port)
	rds := redistest.Start(t)
	fleet := []*instance{}
	for range 2 {
		fleet = append(fleet, startInstance(t, "postgres "+reg.DSN(""), "allow_loopback", "check tcp",
			"interval 200ms", "timeout 100ms", "redis "+rds.URL(), "redis_secret "+secret))
	}
	args := []string{"-postgres", reg.DSN(""), "-redis", rds.URL(), "-allow-loopback", "-check-interval", "200ms", "-check-timeout", "100ms"}
	var r report
	if err := pgtest.WaitFor(settleTimeout, func() error {
		_, r = statusJSON(t, args...)
		return agree(t, r, fleet, func(n nodeReport) error {
			if n.Check != "up" || !n.CheckedByLive || n.CheckedBy != n.Lease {
				return fmt.Errorf("not settled: check %s by %q (live %v), lease %q", n.Check, n.CheckedBy, n.CheckedByLive, n.Lease)
			}
			return nil
		})
	}); err != nil {
		t.Fatalf("the fleet did not settle within %v: %v", settleTimeout, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	raw := rds.Client(t)
	prefix := pgcluster.DefaultRedisPrefix(zone)
	now, err := raw.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var far []redis.Z
	for i := range 50 {
		far = append(far, redis.Z{Score: float64(now.Add(365 * 24 * time.Hour).UnixMilli()), Member: fmt.Sprintf("far%02d", i)})
	}
	if err := raw.ZAdd(ctx, prefix+"members", far...).Err(); err != nil {
		t.Fatal(err)
	}
	wg.Go(func() {
		for ctx.Err() == nil {
			var near []redis.Z
			for i := range 50 {
				near = append(near, redis.Z{Score: float64(time.Now().Add(500 * time.Millisecond).UnixMilli()), Member: fmt.Sprintf("near%02d", i)})
			}
			raw.ZAdd(ctx, prefix+"members", near...)
			time.Sleep(50 * time.Millisecond)
		}
	})
	if err := pgtest.WaitFor(10*time.Second, func() error {
		_, r = statusJSON(t, args...)
		if len(r.Fleet.Refused) < 50 {
			return fmt.Errorf("%d member entries refused", len(r.Fleet.Refused))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	tokens := []string{}
	for _, m := range r.Fleet.Members {
		if strings.HasPrefix(m, "far") || strings.HasPrefix(m, "near") {
			t.Errorf("status lists the forged member %s as live", m)
		}
		tokens = append(tokens, m)
	}
	if len(tokens) != 2 {
		t.Errorf("status lists %d live members %q, want the two instances", len(tokens), tokens)
	}
	_, text, _ := status(t, args...)
	if !strings.Contains(text, "member entries refused, as the instances refuse them") {
		t.Errorf("the table does not say member entries were refused:\n%s", text)
	}

	// pg2's genuine status now, replayed once it is older than the bound.
	statusKey := prefix + "{local/pg2}:status"
	captured, err := raw.HMGet(ctx, statusKey, "v", "s").Result()
	if err != nil || len(captured) != 2 || captured[0] == nil || captured[1] == nil {
		t.Fatalf("pg2's stored status: %v, %v", captured, err)
	}
	bound := 10*time.Second + time.Second + 200*time.Millisecond // resync, lease, interval
	time.Sleep(bound + 500*time.Millisecond)                     // the status ages: the test is of its age
	pg2.stop()
	wg.Go(func() {
		for ctx.Err() == nil {
			raw.HSet(ctx, statusKey, "v", captured[0], "s", captured[1])
			time.Sleep(20 * time.Millisecond)
		}
	})
	if err := pgtest.WaitFor(10*time.Second, func() error {
		for i, in := range fleet {
			if txt := in.txt(t, "pg2.local."+zone); txt["state"] != "out" {
				return fmt.Errorf("instance %d: pg2 %s (%s)", i, txt["state"], txt["reason"])
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	stale := 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		code, r := statusJSON(t, args...)
		n := r.node("local", "pg2")
		switch {
		case n.State == "in":
			t.Fatalf("status says pg2 is in (check %s by %s: %s) while every instance has it out", n.Check, n.CheckedBy, n.StatusError)
		case n.Reason == "check_stale":
			stale++
			if n.State != "unknown" || n.Check != "stale" || code != exitNotOK || !strings.Contains(n.StatusError, "ago, longer than") {
				t.Fatalf("pg2 from its replayed status: %+v, exit %d; want unknown, check stale (too old), exit %d", n, code, exitNotOK)
			}
		case n.Reason != "check_refused":
			t.Fatalf("pg2: %s (%s), want out (check_refused) or unknown (check_stale)", n.State, n.Reason)
		}
	}
	if stale == 0 {
		t.Error("status never read the replayed status: the test shows nothing of it")
	}
	_, text, _ = status(t, args...)
	t.Logf("status while pg2's old status is replayed (%d reads of it seen stale):\n%s", stale, text)
}
