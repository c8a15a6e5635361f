package lock

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// ReadFleet shows a running fleet as it is: both live members, each
// target's lease held by the instance whose Held says so, the status it
// wrote (up for the backend that answers, down for the closed one), a key
// asked for without anything stored, and a status written without the
// secret refused as the instances refuse it.
func TestReadFleet(t *testing.T) {
	srv := redistest.Start(t)
	secret := []byte("0123456789abcdef-fleet")
	up := newBackend(t)
	down := newBackend(t)
	down.ln.Close()
	targets := []health.Target{{Key: "c/up", Addr: up.addr}, {Key: "c/down", Addr: down.addr}}
	var ins []*instance
	for range 2 {
		ins = append(ins, startInstance(t, newClient(t, srv), targets, func(c *Config) { c.Secret = secret }))
	}
	rdb := newClient(t, srv)
	ctx := context.Background()
	// A status written by someone without the secret.
	forged := encode("c/forged", status{V: 1, Addr: up.addr, Holder: "forger", At: time.Now().UnixMicro(), State: "down"}, nil)
	if err := rdb.HSet(ctx, statusKey("fleet:", "c/forged"), "v", "1", "s", forged).Err(); err != nil {
		t.Fatal(err)
	}

	var f *Fleet
	eventually(t, 10*time.Second, "both targets held, with a status from their holder", func() bool {
		var err error
		if f, err = ReadFleet(ctx, rdb, fleetConfig("fleet:", secret), []string{"c/up", "c/down", "c/none"}); err != nil {
			t.Fatal(err)
		}
		for _, tg := range targets {
			k := f.Keys[tg.Key]
			if k.Holder == "" || k.Status == nil || k.Status.Holder != k.Holder || k.Status.Progress.Verdict.State == health.Unknown {
				return false
			}
		}
		return len(f.Members) == 2
	})

	tokens := []string{ins[0].coord.Token(), ins[1].coord.Token()}
	slices.Sort(tokens)
	var members []string
	for _, m := range f.Members {
		members = append(members, m.Token)
		if !m.Until.After(f.Now) {
			t.Errorf("member %s lapses at %v, before Redis's now %v", m.Token, m.Until, f.Now)
		}
	}
	if !slices.Equal(members, tokens) {
		t.Errorf("members %q, want the two instances' tokens %q", members, tokens)
	}
	for _, tg := range targets {
		k := f.Keys[tg.Key]
		var holder *instance
		for _, in := range ins {
			if slices.Contains(in.coord.Held(), tg.Key) {
				holder = in
			}
		}
		if holder == nil || k.Holder != holder.coord.Token() {
			t.Errorf("%s: lease holder %q, want the instance that holds it", tg.Key, k.Holder)
		}
		if !f.Live(k.Holder) {
			t.Errorf("%s: holder %q is not a live member", tg.Key, k.Holder)
		}
		if k.LeaseLeft <= 0 || k.LeaseLeft > holder.coord.LeaseTTL() {
			t.Errorf("%s: %v left of the lease, want (0, %v]", tg.Key, k.LeaseLeft, holder.coord.LeaseTTL())
		}
		if k.Status.Addr != tg.Addr || k.Version <= 0 || k.Err != nil {
			t.Errorf("%s: status of %v, version %d, error %v; want %v, a version, no error", tg.Key, k.Status.Addr, k.Version, k.Err, tg.Addr)
		}
	}
	if st := f.Keys["c/up"].Status.Progress.Verdict; st.State != health.Up {
		t.Errorf("c/up: %v, want up", st)
	}
	if st := f.Keys["c/down"].Status.Progress.Verdict; st.State != health.Down || st.Cause != "refused" {
		t.Errorf("c/down: %v (cause %q), want down, refused", st.State, st.Cause)
	}
	if k := f.Keys["c/none"]; k != (KeyState{}) {
		t.Errorf("c/none, never written: %+v, want nothing", k)
	}
	if k := f.Keys["c/forged"]; k.Status != nil || k.Err == nil || k.Version != 1 {
		t.Errorf("c/forged, unsigned: %+v, want refused with an error", k)
	}
	// Without the secret, signatures are not checked, as by an instance
	// without redis_secret.
	f2, err := ReadFleet(ctx, rdb, fleetConfig("fleet:", nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if k := f2.Keys["c/up"]; k.Status == nil || k.Err != nil {
		t.Errorf("c/up read without the secret: %+v, want its status", k)
	}
}

// ReadFleet writes nothing: Redis counts no change while it reads leases,
// statuses and members; and a member whose membership has lapsed is not
// live.
func TestReadFleetWritesNothing(t *testing.T) {
	srv := redistest.Start(t)
	rdb := newClient(t, srv)
	ctx := context.Background()
	l, err := NewLeases(rdb, "p:")
	if err != nil {
		t.Fatal(err)
	}
	cfg := fleetConfig("p:", nil)
	b, err := cfg.bounds()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Heartbeat(ctx, b.memberTTL, b.memberAhead()); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, membersKey("p:"), redis.Z{Score: 1000, Member: "lapsed"}).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := l.Acquire(ctx, "c/n", b.ttl); err != nil || !ok {
		t.Fatalf("acquire: %v, %v", ok, err)
	}
	st := status{Addr: newBackend(t).addr, Holder: l.Token(), At: time.Now().UnixMicro(), State: "up", Role: "primary", OK: 2}
	if _, ok, err := l.WriteVersioned(ctx, "c/n", time.Now().UnixMicro(), func(v int64) []byte { st.V = v; return encode("c/n", st, nil) }, WriteOptions{Publish: true}); err != nil || !ok {
		t.Fatalf("publish: %v, %v", ok, err)
	}
	changes := func() string {
		info, err := rdb.Info(ctx, "persistence").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "rdb_changes_since_last_save:"); ok {
				return v
			}
		}
		t.Fatalf("no rdb_changes_since_last_save in INFO persistence:\n%s", info)
		return ""
	}
	before := changes()
	f, err := ReadFleet(ctx, rdb, cfg, []string{"c/n", "c/other"})
	if err != nil {
		t.Fatal(err)
	}
	if after := changes(); after != before {
		t.Errorf("Redis counted changes %s before ReadFleet, %s after: it wrote", before, after)
	}
	if len(f.Members) != 1 || f.Members[0].Token != l.Token() || f.Live("lapsed") {
		t.Errorf("members %+v, want only %s (lapsed is not live)", f.Members, l.Token())
	}
	k := f.Keys["c/n"]
	if k.Holder != l.Token() || k.Status == nil || k.Status.Progress.Verdict.Role != "primary" || k.Status.Progress.OK != 2 {
		t.Errorf("c/n: %+v, want held by %s, up as primary after 2 successes", k, l.Token())
	}
}

// fleetConfig is the Config of the test fleets' instances (startInstance),
// as a tool reading them gives it.
func fleetConfig(prefix string, secret []byte) Config {
	return Config{Prefix: prefix, Secret: secret, Interval: fleetInterval, Timeout: fleetTimeout, Resync: time.Second}
}

// A Redis that does not answer ends ReadFleet with an error within about
// CallTimeout, not a hang.
func TestReadFleetUnreachable(t *testing.T) {
	srv := redistest.Start(t)
	rdb := newClient(t, srv)
	srv.Stop()
	start := time.Now()
	_, err := ReadFleet(context.Background(), rdb, fleetConfig("p:", nil), nil)
	if err == nil {
		t.Fatal("no error with Redis stopped")
	}
	if d := time.Since(start); d > 3*CallTimeout {
		t.Errorf("took %v with Redis stopped, want about CallTimeout (%v)", d, CallTimeout)
	}
	if !strings.Contains(err.Error(), "lock: read Redis's clock") {
		t.Errorf("error %q does not say what failed", err)
	}
}

// A member's name (its host and DNS listener) is read with its token, as
// it stored it beside its membership: shown only when signed with the
// secret, in printable characters only, and gone with the member, whether
// it leaves or lapses.
func TestFleetMemberNames(t *testing.T) {
	srv := redistest.Start(t)
	rdb := newClient(t, srv)
	ctx := context.Background()
	secret := []byte("0123456789abcdef-names")
	b, err := fleetConfig("fleet:", secret).bounds()
	if err != nil {
		t.Fatal(err)
	}
	member := func(name string) *Leases {
		l, err := NewLeases(rdb, "fleet:")
		if err != nil {
			t.Fatal(err)
		}
		l.secret, l.name = secret, name
		if _, err := l.Heartbeat(ctx, b.memberTTL, b.memberAhead()); err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b2, c := member("dns-1.example.com:53"), member("dns-2:53\x1b[2J"), member("")
	// A name written for c by someone without the secret.
	if err := rdb.HSet(ctx, namesKey("fleet:"), c.memberEntry(), "forged.host:53").Err(); err != nil {
		t.Fatal(err)
	}
	read := func() map[string]Member {
		f, err := ReadFleet(ctx, rdb, fleetConfig("fleet:", secret), nil)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]Member{}
		for _, m := range f.Members {
			out[m.Token] = m
		}
		return out
	}
	ms := read()
	if got := ms[a.Token()]; got.Name != "dns-1.example.com:53" || got.NameErr != nil {
		t.Errorf("member a: name %q (%v), want dns-1.example.com:53", got.Name, got.NameErr)
	}
	if len(ms) != 3 {
		t.Fatalf("%d members read, want 3", len(ms))
	}
	if got := ms[b2.Token()].Name; got != "dns-2:53?[2J" {
		t.Errorf("member b: name %q, want its control character shown as ?", got)
	}
	if got := ms[c.Token()]; got.Name != "" || got.NameErr == nil || !strings.Contains(got.NameErr.Error(), "not signed with the secret") {
		t.Errorf("member c: name %q (%v), want the forged name refused as not signed", got.Name, got.NameErr)
	}

	// Read without the secret, nothing is checked (as members are not),
	// and a name is shown without its signature.
	f, err := ReadFleet(ctx, rdb, fleetConfig("fleet:", nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range f.Members {
		if m.Token == a.Token() && m.Name != "dns-1.example.com:53" {
			t.Errorf("read without the secret, member a's name is %q, want dns-1.example.com:53", m.Name)
		}
	}

	// a leaves: its name goes with it. b lapses: c's next heartbeat drops
	// b's name.
	if err := a.Leave(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZRem(ctx, membersKey("fleet:"), b2.memberEntry()).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Heartbeat(ctx, b.memberTTL, b.memberAhead()); err != nil {
		t.Fatal(err)
	}
	names, err := rdb.HKeys(ctx, namesKey("fleet:")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names, a.memberEntry()) || slices.Contains(names, b2.memberEntry()) {
		t.Errorf("names of members gone still stored: %q", names)
	}
	// c stores no name of its own: the forged one stays refused, and is
	// anyone's write that c's heartbeat drops.
	if slices.Contains(names, c.memberEntry()) {
		t.Errorf("c stores no name, but a name is still stored for it: %q", names)
	}
}
