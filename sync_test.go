package pgcluster

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/health"
)

// primaryWith is a primary's verdict listing replicas as pg_stat_replication
// showed them to its check.
func primaryWith(replicas ...health.Replica) health.Verdict {
	v := up("primary", 1000)
	v.Replicas = append([]health.Replica{}, replicas...)
	return v
}

// sync.<cluster> answers the serving standbys the cluster's primary
// reports as synchronous, matched to their rows by application_name, and
// nothing else: no asynchronous standby, no primary, no fail-open. A
// standby's TXT shows its sync state and lag as the primary sees them.
func TestSyncName(t *testing.T) {
	view := func(p health.Verdict) health.View {
		return health.ViewOf(map[string]health.Verdict{"local/pg1": p, "local/pg2": up("standby", 900), "local/pg3": up("standby", 900)})
	}
	p := checked(checkPostgres, view(primaryWith(
		health.Replica{Name: "pg2", Sync: health.ReplicaSync, Lag: 1500 * time.Microsecond},
		health.Replica{Name: "pg3", Sync: health.ReplicaAsync, Lag: 2 * time.Second})))
	if got := addrs(t, p, "sync.local."); got != "192.0.2.2" {
		t.Errorf("sync.: %q, want pg2 alone", got)
	}
	txt := query(t, p, "pg2.local."+testZone, dns.TypeTXT).Answer[0].String()
	for _, want := range []string{`"sync_state=sync"`, `"primary_lag=1.5ms"`} {
		if !strings.Contains(txt, want) {
			t.Errorf("pg2 TXT lacks %s: %s", want, txt)
		}
	}
	if txt := query(t, p, "sync.local."+testZone, dns.TypeTXT).Answer[0].String(); !strings.Contains(txt, `"state=serving"`) || !strings.Contains(txt, `"nodes=pg2"`) {
		t.Errorf("sync. TXT: %s", txt)
	}
	if srv := query(t, p, "_postgresql._tcp.sync.local."+testZone, dns.TypeSRV); len(srv.Answer) != 1 {
		t.Errorf("SRV of sync.: %v", srv.Answer)
	}

	// The primary names pg3 now: the content changes with it.
	before := p.snapshot().hash
	p = checked(checkPostgres, view(primaryWith(
		health.Replica{Name: "pg2", Sync: health.ReplicaPotential},
		health.Replica{Name: "pg3", Sync: health.ReplicaSync})))
	if got := addrs(t, p, "sync.local."); got != "" || !strings.Contains(query(t, p, "sync.local."+testZone, dns.TypeAAAA).String(), "2001:db8::3") {
		t.Errorf("sync. after the swap: A %q, want pg3 (IPv6) alone", got)
	}
	if p.snapshot().hash == before {
		t.Error("a change of the synchronous standby left the content hash as it was")
	}

	// No synchronous standby, the check's role without pg_monitor, no
	// single primary: NODATA, and TXT says which.
	hidden := up("primary", 1000)
	hidden.ReplicasHidden = true
	e := view(up("primary", 1000)).Edit()
	e.Set("local/pg2", up("primary", 900))
	split := e.View()
	for _, tc := range []struct {
		name  string
		view  health.View
		state string
	}{
		{"only async", view(primaryWith(health.Replica{Name: "pg2", Sync: health.ReplicaAsync}, health.Replica{Name: "pg3", Sync: health.ReplicaQuorum})), "none"},
		{"no pg_monitor", view(hidden), "no_privilege"},
		{"split brain", split, "unknown"},
		{"primary down", health.ViewOf(map[string]health.Verdict{"local/pg1": down("refused"), "local/pg2": up("standby", 900)}), "unknown"},
	} {
		p := checked(checkPostgres, tc.view)
		r := query(t, p, "sync.local."+testZone, dns.TypeA)
		if len(r.Answer) != 0 || r.Rcode != dns.RcodeSuccess {
			t.Errorf("%s: sync. answered %v, want NODATA", tc.name, r.Answer)
		}
		if txt := query(t, p, "sync.local."+testZone, dns.TypeTXT).Answer[0].String(); !strings.Contains(txt, `"state=`+tc.state+`"`) {
			t.Errorf("%s: sync. TXT %s, want state=%s", tc.name, txt, tc.state)
		}
	}
	if txt := query(t, checked(checkPostgres, view(hidden)), "pg2.local."+testZone, dns.TypeTXT).Answer[0].String(); !strings.Contains(txt, "no_privilege") {
		t.Errorf("pg2 TXT with the primary's standbys hidden: %s", txt)
	}
}

// A standby whose walreceiver keeps the default application_name is found
// by its address, where only one standby connects from it.
func TestSyncMatchByAddress(t *testing.T) {
	view := func(replicas ...health.Replica) health.View {
		return health.ViewOf(map[string]health.Verdict{"local/pg1": primaryWith(replicas...), "local/pg2": up("standby", 900), "local/pg3": up("standby", 900)})
	}
	pg2 := netip.MustParseAddr("192.0.2.2")
	p := checked(checkPostgres, view(health.Replica{Name: "walreceiver", Addr: pg2, Sync: health.ReplicaSync}))
	if got := addrs(t, p, "sync.local."); got != "192.0.2.2" {
		t.Errorf("sync. matched by address: %q, want pg2", got)
	}
	// Two walsenders from one address: neither is taken for pg2.
	p = checked(checkPostgres, view(health.Replica{Name: "walreceiver", Addr: pg2, Sync: health.ReplicaSync},
		health.Replica{Name: "walreceiver", Addr: pg2, Sync: health.ReplicaAsync}))
	if got := addrs(t, p, "sync.local."); got != "" {
		t.Errorf("sync. with two walsenders from one address: %q, want none", got)
	}
}

// max_lag as a duration judges replay_lag as the primary reports it: a
// standby further behind, or one the primary does not list (its lag
// unknown), leaves standby. and sync.; the cluster name keeps it.
func TestMaxLagDuration(t *testing.T) {
	p := checked(checkPostgres, health.ViewOf(map[string]health.Verdict{
		"local/pg1": primaryWith(health.Replica{Name: "pg2", Sync: health.ReplicaSync, Lag: 3 * time.Second}),
		"local/pg2": up("standby", 900), "local/pg3": up("standby", 900)}),
		func(s *settings) { s.maxLagTime = time.Second })
	if got := addrs(t, p, "standby.local."); got != "" {
		t.Errorf("standby. with pg2 3 s behind and pg3 unlisted, max_lag 1s: %q, want none", got)
	}
	if got := addrs(t, p, "sync.local."); got != "" {
		t.Errorf("sync. with its standby lagging: %q, want none", got)
	}
	if got := addrs(t, p, "local."); !strings.Contains(got, "192.0.2.2") {
		t.Errorf("local. lost the lagging standby: %q", got)
	}
	txt := query(t, p, "pg2.local."+testZone, dns.TypeTXT).Answer[0].String()
	if !strings.Contains(txt, "over max_lag 1s: out of standby.") {
		t.Errorf("pg2 TXT: %s", txt)
	}
	p = checked(checkPostgres, health.ViewOf(map[string]health.Verdict{
		"local/pg1": primaryWith(health.Replica{Name: "pg2", Sync: health.ReplicaSync, Lag: 300 * time.Millisecond}, health.Replica{Name: "pg3", Sync: health.ReplicaAsync}),
		"local/pg2": up("standby", 900), "local/pg3": up("standby", 900)}),
		func(s *settings) { s.maxLagTime = time.Second })
	if got := addrs(t, p, "standby.local."); got != "192.0.2.2" {
		t.Errorf("standby. within max_lag 1s: A %q, want pg2 (and pg3 in AAAA)", got)
	}
}

// pgclusterctl's Judge shows a standby's sync state and lag as its primary
// reports them, and judges max_lag as a duration as an instance does.
func TestJudgeSyncState(t *testing.T) {
	view := health.ViewOf(map[string]health.Verdict{
		"local/pg1": primaryWith(health.Replica{Name: "pg2", Sync: health.ReplicaSync, Lag: 2 * time.Second}),
		"local/pg2": up("standby", 900), "local/pg3": up("standby", 900)})
	cs, err := Judge(testNodes(), view, JudgeOptions{Zone: testZone, Check: checkPostgres, MaxLagTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Judgement{}
	for _, j := range cs[0].Nodes {
		got[j.Name] = j
	}
	if j := got["pg2"]; j.SyncState != health.ReplicaSync || j.PrimaryLag != 2*time.Second || !j.Lagging {
		t.Errorf("pg2: sync %q, lag %v, lagging %v; want sync, 2s, lagging over 1s", j.SyncState, j.PrimaryLag, j.Lagging)
	}
	if j := got["pg3"]; j.SyncState != "" || !j.Lagging {
		t.Errorf("pg3, not listed by the primary: sync %q, lagging %v; want unknown and lagging", j.SyncState, j.Lagging)
	}
}
