package health

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// A primary's verdict lists its standbys as pg_stat_replication shows them:
// each by its application_name (a standby's cluster_name when its
// primary_conninfo names none) and the address its connection came from,
// with its sync_state. A standby
// that synchronous_standby_names names FIRST is sync, the other async;
// naming the other instead and reloading swaps them at the next probe. A
// monitoring role without pg_monitor sees walsenders but none of their
// columns: the verdict says the replicas are hidden rather than list none.
// A standby's verdict lists nothing.
func TestPostgresReplicasAsThePrimarySeesThem(t *testing.T) {
	primary := pgtest.New(t, pgtest.Options{Host: "127.0.0.91", Settings: map[string]string{"synchronous_standby_names": "FIRST 1 (pg2)"}})
	var standbys []*pgtest.Postgres
	for i, name := range []string{"pg2", "pg3"} {
		s, err := pgtest.StartStandby(primary, pgtest.Options{Host: fmt.Sprintf("127.0.0.%d", 92+i), Settings: map[string]string{"cluster_name": name}})
		if err != nil {
			t.Fatalf("this test needs streaming standbys: %v", err)
		}
		t.Cleanup(s.Close)
		standbys = append(standbys, s)
	}
	query(t, primary, func(conn *pgx.Conn) error {
		_, err := conn.Exec(context.Background(), "CREATE ROLE monitor LOGIN; CREATE ROLE bare LOGIN")
		return err
	})
	addrOf := func(pg *pgtest.Postgres) netip.AddrPort {
		return netip.AddrPortFrom(netip.MustParseAddr(pg.Host), uint16(pg.Port))
	}
	c := mustNew(t, Config{Check: CheckPostgres, Options: "user=postgres dbname=postgres", Interval: 100 * time.Millisecond, Timeout: 2 * time.Second, Rise: 1})
	c.SetTargets([]Target{{"c/pg1", addrOf(primary)}, {"c/pg2", addrOf(standbys[0])}})
	rec, _ := start(t, c, 0)

	syncOf := func(want map[string]string) func(Verdict, bool) error {
		return func(v Verdict, ok bool) error {
			got := map[string]string{}
			for _, r := range v.Replicas {
				got[r.Name] = r.Sync
				// On loopback a standby's connection comes from
				// 127.0.0.1, whatever address it listens on.
				if !r.Addr.IsLoopback() {
					return fmt.Errorf("replica %s at %v, want the address its connection came from", r.Name, r.Addr)
				}
			}
			if !ok || v.State != Up || fmt.Sprint(got) != fmt.Sprint(want) || v.ReplicasHidden {
				return fmt.Errorf("verdict %+v: want Up with replicas %v", v, want)
			}
			return nil
		}
	}
	v := rec.waitVerdict("c/pg1", 20*time.Second, syncOf(map[string]string{"pg2": ReplicaSync, "pg3": ReplicaAsync}))
	if !slices.IsSortedFunc(v.Replicas, compareReplicas) {
		t.Errorf("replicas %+v: want them in name order", v.Replicas)
	}
	if sv := rec.waitVerdict("c/pg2", 10*time.Second, isState(Up, CauseOK)); sv.Replicas != nil || sv.ReplicasHidden {
		t.Errorf("a standby's verdict lists replicas %+v (hidden %v): want none", sv.Replicas, sv.ReplicasHidden)
	}

	query(t, primary, func(conn *pgx.Conn) error {
		if _, err := conn.Exec(context.Background(), "ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (pg3)'"); err != nil {
			return err
		}
		_, err := conn.Exec(context.Background(), "SELECT pg_reload_conf()")
		return err
	})
	rec.waitVerdict("c/pg1", 20*time.Second, syncOf(map[string]string{"pg2": ReplicaAsync, "pg3": ReplicaSync}))

	// The same server through roles with and without pg_monitor.
	for _, tc := range []struct {
		user   string
		hidden bool
	}{{"bare", true}, {"monitor", false}} {
		if !tc.hidden {
			query(t, primary, func(conn *pgx.Conn) error {
				_, err := conn.Exec(context.Background(), "GRANT pg_monitor TO monitor")
				return err
			})
		}
		mc := mustNew(t, Config{Check: CheckPostgres, Options: "user=" + tc.user + " dbname=postgres", Interval: 100 * time.Millisecond, Timeout: 2 * time.Second, Rise: 1})
		mc.SetTargets([]Target{{"c/pg1", addrOf(primary)}})
		mrec, stop := start(t, mc, 0)
		v := mrec.waitVerdict("c/pg1", 10*time.Second, isState(Up, CauseOK))
		if v.ReplicasHidden != tc.hidden || tc.hidden && len(v.Replicas) != 0 || !tc.hidden && len(v.Replicas) != 2 {
			t.Errorf("role %s: replicas %+v, hidden %v; want hidden %v", tc.user, v.Replicas, v.ReplicasHidden, tc.hidden)
		}
		stop()
	}
}

// parseReplicas reads pg_stat_replication's rows as pgQuery aggregates
// them, and refuses what no server sends.
func TestParseReplicas(t *testing.T) {
	rs, hidden, err := parseReplicas([]byte(`[["b","127.0.0.3","async","0/3000060",0.25],["a",null,"sync","0/3000060",null],["",null,"potential",null,null]]`))
	if err != nil || hidden {
		t.Fatalf("parseReplicas: %v, hidden %v", err, hidden)
	}
	want := []Replica{
		{Name: "", Sync: "potential"},
		{Name: "a", Sync: ReplicaSync, ReplayLSN: 0x3000060},
		{Name: "b", Addr: netip.MustParseAddr("127.0.0.3"), Sync: ReplicaAsync, ReplayLSN: 0x3000060, Lag: 250 * time.Millisecond},
	}
	if !slices.Equal(rs, want) {
		t.Errorf("parseReplicas = %+v, want %+v", rs, want)
	}
	if _, hidden, err := parseReplicas([]byte(`[[null,null,null,null,null]]`)); err != nil || !hidden {
		t.Errorf("a row without columns: hidden %v, %v; want hidden", hidden, err)
	}
	if rs, hidden, err := parseReplicas(nil); rs != nil || hidden || err != nil {
		t.Errorf("NULL (a standby): %+v %v %v, want nothing", rs, hidden, err)
	}
	for _, bad := range []string{`{}`, `[["a"]]`, `[["a",null,"sometimes",null,null]]`, `[["a","not an address","sync",null,null]]`, `[["a",null,"sync","3000060",null]]`, `[["a",null,"sync",null,-1]]`, `[["a",null,"sync",null,"x"]]`} {
		if _, _, err := parseReplicas([]byte(bad)); err == nil {
			t.Errorf("parseReplicas(%s): no error", bad)
		}
	}
}

// Verdict.Equal tells apart verdicts that differ in any field but the
// probe's time, and WAL progress only when asked: a field added to Verdict
// and forgotten there fails this test.
func TestVerdictEqualEveryField(t *testing.T) {
	base := Verdict{Replicas: []Replica{{Name: "a", Sync: ReplicaSync}}}
	rt := reflect.TypeOf(base)
	for i := range rt.NumField() {
		f := rt.Field(i)
		changed := base
		rv := reflect.ValueOf(&changed).Elem().Field(i)
		switch f.Type.Kind() {
		case reflect.Slice:
			rv.Set(reflect.ValueOf([]Replica{{Name: "a", Sync: ReplicaAsync}}))
		case reflect.Bool:
			rv.SetBool(true)
		case reflect.String:
			rv.SetString("x")
		case reflect.Int, reflect.Int64:
			rv.SetInt(1)
		case reflect.Uint8, reflect.Uint32, reflect.Uint64:
			rv.SetUint(1)
		case reflect.Struct: // Last
			rv.Set(reflect.ValueOf(time.Unix(1, 0)))
		default:
			t.Fatalf("field %s of kind %v: teach this test to change it", f.Name, f.Type.Kind())
		}
		progressOnly := f.Name == "WAL"
		switch {
		case f.Name == "Last":
			if !base.Equal(changed, true) {
				t.Errorf("verdicts that differ only in Last are not Equal")
			}
		case progressOnly:
			if base.Equal(changed, true) || !base.Equal(changed, false) {
				t.Errorf("%s: Equal with progress %v, without %v; want false, true", f.Name, base.Equal(changed, true), base.Equal(changed, false))
			}
		default:
			if base.Equal(changed, true) || base.Equal(changed, false) {
				t.Errorf("verdicts that differ in %s are Equal", f.Name)
			}
		}
	}
	lagged := base
	lagged.Replicas = []Replica{{Name: "a", Sync: ReplicaSync, Lag: time.Second}}
	if base.Equal(lagged, true) || !base.Equal(lagged, false) {
		t.Errorf("a replica's lag: want a difference with progress only")
	}
	none := base
	none.Replicas = []Replica{}
	if none.Equal(Verdict{}, false) {
		t.Errorf("a primary without standbys Equal to a verdict that says nothing of them")
	}
}
