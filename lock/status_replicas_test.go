package lock

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// A primary's standbys, as its holder saw them, reach every reader as they
// were: names, addresses, sync states, replay positions and lags, a
// primary without standbys as one without (not as a status that says
// nothing of them), and a role that may not see them as hidden. What no
// primary shows is refused whole.
func TestStatusReplicas(t *testing.T) {
	addr := netip.MustParseAddrPort("127.0.0.1:5432")
	at := time.UnixMicro(1_700_000_000_000_000)
	for _, v := range []health.Verdict{
		{State: health.Up, Role: health.RolePrimary, Replicas: []health.Replica{
			{Name: "pg2", Addr: netip.MustParseAddr("127.0.0.2"), Sync: health.ReplicaSync, ReplayLSN: 1 << 33, Lag: 1500 * time.Microsecond},
			{Name: "pg3", Addr: netip.MustParseAddr("::1"), Sync: health.ReplicaAsync, Lag: 3 * time.Second},
			{Name: "walreceiver", Sync: health.ReplicaPotential}}},
		{State: health.Up, Role: health.RolePrimary, Replicas: []health.Replica{}},
		{State: health.Up, Role: health.RolePrimary, ReplicasHidden: true},
		{State: health.Up, Role: health.RoleStandby},
	} {
		st := newStatus(addr, "h", at, health.Progress{Verdict: v, OK: 2})
		st.V = at.UnixMicro()
		got, err := vetStatus("c/pg1", st.V, encode("c/pg1", st, []byte("0123456789abcdef")), []byte("0123456789abcdef"), st.V, time.Second)
		if err != nil {
			t.Fatalf("%+v: %v", v, err)
		}
		p := got.progress().Verdict
		if !reflect.DeepEqual(p.Replicas, v.Replicas) || p.ReplicasHidden != v.ReplicasHidden {
			t.Errorf("replicas %#v (hidden %v) read back as %#v (hidden %v)", v.Replicas, v.ReplicasHidden, p.Replicas, p.ReplicasHidden)
		}
	}
	// An older instance's status has no replicas field: not a primary without standbys.
	old := `{"v":5,"addr":"127.0.0.1:5432","holder":"h","at":5,"state":"up","role":"primary","ok":2,"fail":0}`
	st, err := decode("c/pg1", []byte(old), nil)
	if err != nil || st.progress().Verdict.Replicas != nil {
		t.Errorf("a status without replicas: %+v, %v; want nil replicas", st.progress().Verdict.Replicas, err)
	}
	many := `[` + strings.Repeat(`{"n":"x","s":"sync"},`, maxStatusReplicas) + `{"n":"x","s":"sync"}]`
	for _, repl := range []string{
		many,
		`[{"n":"` + strings.Repeat("n", maxReplicaName+1) + `","s":"sync"}]`,
		`[{"n":"a","a":"127.0.0.256","s":"sync"}]`,
		`[{"n":"a","a":"::0001","s":"sync"}]`,
		`[{"n":"a","s":"sometimes"}]`,
		`[{"n":"a","s":"async","lag":-1}]`,
		`[{"n":"a","s":"async","lag":9223372036854776}]`,
	} {
		b := strings.Replace(old, `"fail":0}`, `"fail":0,"repl":`+repl+`}`, 1)
		if _, err := decode("c/pg1", []byte(b), nil); err == nil {
			t.Errorf("replicas %.80s accepted", repl)
		}
	}
}
