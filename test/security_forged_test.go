package test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// defaultPrefix is the default redis_prefix for Zone (README, redis_prefix).
const defaultPrefix = "pgcluster:" + Zone + ":"

// statusKeyOf names the status key of node of cluster local under defaultPrefix.
func statusKeyOf(node string) string { return defaultPrefix + "{local/" + node + "}:status" }

var (
	rejectedMetric = `coredns_pgcluster_redis_messages_total{result="rejected",zone="` + Zone + `"}`
	staleMetric    = `coredns_pgcluster_redis_messages_total{result="stale",zone="` + Zone + `"}`
)

// forgedStatus is a status as lock/ writes it (its JSON fields), made by
// someone who is not a holder.
type forgedStatus struct {
	Addr   string `json:"addr"`
	Holder string `json:"holder"`
	At     int64  `json:"at"`
	State  string `json:"state"`
	Cause  string `json:"cause,omitempty"`
	OK     int    `json:"ok"`
	Fail   int    `json:"fail"`
}

// signed returns body signed for key with secret as lock/ signs a status:
// "sig=<hex HMAC-SHA256 of key, 0, body> <body>".
func signed(key string, body, secret []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write(body)
	return []byte("sig=" + hex.EncodeToString(h.Sum(nil)) + " " + string(body))
}

// statusMessage is a Pub/Sub message of a status: "<version> <len(key)> <key><status>".
func statusMessage(version int64, key string, status []byte) string {
	return fmt.Sprintf("%d %d %s%s", version, len(key), key, status)
}

// TestSecurityForgedStatus: a fleet of two signs its statuses with
// redis_secret. Statuses written straight into Redis by someone without
// the secret — a "down" for a backend that is up, unsigned, signed with
// another key, or a genuine signed status of another node replayed under
// this one, published with versions far above the real ones — are
// rejected and counted by both instances and move no answer; a forger
// rewriting a stored status every few milliseconds while a third instance
// starts does not keep the backend out of that instance's answers, which
// counts them too. A genuine "up" captured earlier and published again
// after the backend went down is counted stale and brings nothing back.
func TestSecurityForgedStatus(t *testing.T) {
	const interval, timeout = 200 * time.Millisecond, 100 * time.Millisecond
	secret := coretest.RandomHex(24)
	rs := redistest.Start(t)
	raw := rs.Client(t)
	ctx := Ctx(t)
	f := newFleet(t, fleetOptions{interval: interval, timeout: timeout, backends: 2, extra: []string{"redis_secret " + secret}})
	corefile := f.corefile(rs.URL())
	ins := startInstances(t, corefile, 2)
	Eventually(t, 20*time.Second, coordinated(t, ins, len(f.backends)))
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts()))

	// A genuine signed "up" of n1, for the replay below.
	captured, err := raw.HGet(ctx, statusKeyOf("n1"), "s").Result()
	if err != nil {
		t.Fatal(err)
	}
	capturedAt := time.Now()
	var genuine forgedStatus
	if err := json.Unmarshal([]byte(captured[len("sig=")+64+1:]), &genuine); err != nil || genuine.State != "up" {
		t.Fatalf("the stored status of n1 is not a signed up status: %q (%v)", captured, err)
	}

	// The forger passes for n0's holder: its token is the lease's value.
	n0 := f.backends[0]
	holder, err := raw.Get(ctx, defaultPrefix+"{local/n0}:lease").Result()
	if err != nil {
		t.Fatal(err)
	}
	down, _ := json.Marshal(forgedStatus{Addr: net.JoinHostPort(n0.host, n0.port), Holder: holder,
		At: time.Now().UnixMicro(), State: "down", Cause: "refused", Fail: 1})
	huge := time.Now().UnixMicro() * 4 // far above every real version
	forged := [][]byte{
		down, // unsigned
		signed("local/n0", down, []byte("not-the-fleet-secret")), // another key
		[]byte(captured), // n1's genuine status under n0
	}
	before := []float64{metric(t, ins[0], rejectedMetric), metric(t, ins[1], rejectedMetric)}
	for i, body := range forged {
		if err := raw.Publish(ctx, defaultPrefix+"statuses", statusMessage(huge+int64(i), "local/n0", body)).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// Accepted, a "down" would hold until the next resync (10 s): the
	// holder does not publish a verdict that did not change.
	holdsFor(t, time.Second, "after forged statuses", answersExactly(ins, f.hosts()))
	for k, in := range ins {
		Eventually(t, 5*time.Second, metricIs(t, in, rejectedMetric, before[k]+float64(len(forged))))
	}
	Eventually(t, time.Second, answersExactly(ins, f.hosts()))

	// A forger rewriting n0's stored status while a new instance starts:
	// the new instance reads it at start, rejects it, answers n0. n0's
	// holder writes its own status back at each probe, so a start may
	// read that one in the moment before the forger's next write: the
	// instance is started again (it must answer n0 every time) until one
	// start has read a forged status, at most startsUnderForger times.
	const startsUnderForger = 4
	var late *Instance
	for start := 1; ; start++ {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			for i := int64(0); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				raw.HSet(context.Background(), statusKeyOf("n0"), "v", huge+100+i, "s", down)
				time.Sleep(2 * time.Millisecond)
			}
		})
		late = StartFleetInstanceNoWait(t, corefile)
		if n := alwaysAnswers(t, late, n0.host); n == 0 {
			t.Fatal("the instance started under the forger never answered")
		}
		close(stop)
		wg.Wait()
		got := metric(t, late, rejectedMetric)
		if got > 0 {
			t.Logf("instance started under a forger (start %d): %v statuses rejected", start, got)
			break
		}
		if start == startsUnderForger {
			t.Fatalf("none of %d instances started under the forger counted a rejected status: none read the forged one", start)
		}
		t.Logf("start %d under the forger read n0's genuine status, not the forged one: starting again", start)
		if err := late.Term(); err != nil {
			t.Fatal(err)
		}
	}
	ins = append(ins, late)

	// The replay: n1 goes down for real, then its captured "up" comes back.
	f.backends[1].Close()
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts(1)))
	// A status of another holder is a replay once it is older than a
	// lease (1 s here) behind the one applied.
	Eventually(t, 10*time.Second, func() error {
		if time.Since(capturedAt) < 2*time.Second {
			return fmt.Errorf("the captured status is %v old", time.Since(capturedAt))
		}
		return nil
	})
	var stale []float64
	for _, in := range ins {
		stale = append(stale, metric(t, in, staleMetric))
	}
	if err := raw.Publish(ctx, defaultPrefix+"statuses", statusMessage(huge*2, "local/n1", []byte(captured))).Err(); err != nil {
		t.Fatal(err)
	}
	for k, in := range ins {
		Eventually(t, 5*time.Second, func() error {
			if got := metric(t, in, staleMetric); got <= stale[k] {
				return fmt.Errorf("%s counted no stale status after the replay", in.Addr())
			}
			return nil
		})
	}
	holdsFor(t, time.Second, "after the replay", answersExactly(ins, f.hosts(1)))
}

// alwaysAnswers polls an instance from its start until it has answered
// for two seconds, failing if an answer lacks host; it returns how many
// answers it checked.
func alwaysAnswers(t testing.TB, in *Instance, host string) int {
	t.Helper()
	return pollAnswers(t, in, func(n int, got []string) {
		if !slices.Contains(got, host) {
			t.Fatalf("answer %d of an instance started under a forger lacks %s: %v", n, host, got)
		}
	})
}
