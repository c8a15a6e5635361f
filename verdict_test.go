package pgcluster

import (
	"math"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// txtOf returns the TXT record at name, in presentation format.
func txtOf(s *snapshot, name string) string {
	e := entryOf(s, name)
	if e == nil || e.txt == nil {
		return ""
	}
	return e.txt.String()
}

// A heartbeat too old or too far in the future for a time.Duration arrives
// clamped; one in the future by more than stale_after is as untrustworthy as a
// stale one.
func TestHeartbeatBounds(t *testing.T) {
	cases := []struct {
		age    time.Duration
		reason string
	}{
		{0, reasonServing},
		{9 * time.Second, reasonServing},
		{-9 * time.Second, reasonServing}, // clock skew within stale_after
		{11 * time.Second, reasonStale},
		{math.MaxInt64, reasonStale},                        // '0001-01-01', '4713-01-01 BC'
		{-74 * 365 * 24 * time.Hour, reasonFutureHeartbeat}, // '2100-01-01'
		{math.MinInt64, reasonFutureHeartbeat},              // 'infinity'
	}
	for _, tc := range cases {
		n := node("local", "pg1", "192.0.2.1", "primary")
		n.HeartbeatAge = tc.age
		s := build(buildInput{settings: &settings{zones: []string{testZone}, ttl: 5, staleAfter: 10 * time.Second}, nodes: []Node{n}})
		txt := txtOf(s, "pg1.local."+testZone)
		if !strings.Contains(txt, `"reason=`+tc.reason+`"`) {
			t.Errorf("heartbeat age %v: want reason %s, TXT %s", tc.age, tc.reason, txt)
		}
		if served := addrsOf(entryOf(s, "local."+testZone)) != ""; served != (tc.reason == reasonServing) {
			t.Errorf("heartbeat age %v: served %t", tc.age, served)
		}
		if entryOf(s, "pg1.local."+testZone).txt == nil {
			t.Fatal("TXT record expected")
		}
	}
}

// Addresses no client can connect to are out, with the reason.
func TestUnusableAddresses(t *testing.T) {
	for _, a := range []string{"0.0.0.0", "::", "224.0.0.1", "ff02::1", "255.255.255.255", "169.254.1.1", "fe80::1"} {
		n := node("local", "pg1", a, "primary")
		s := build(buildInput{settings: &settings{zones: []string{testZone}, ttl: 5, allowLoopback: true}, nodes: []Node{n}})
		if got := addrsOf(entryOf(s, "local."+testZone)); got != "" {
			t.Errorf("%s is served: %s", a, got)
		}
		if txt := txtOf(s, "pg1.local."+testZone); !strings.Contains(txt, `"reason=unusable_address"`) || !strings.Contains(txt, a) {
			t.Errorf("%s: TXT should say why: %s", a, txt)
		}
	}
	// inet '10.1.0.0/16': a network, not a host.
	n := node("local", "pg1", "10.1.0.0", "primary")
	n.Network = netip.MustParsePrefix("10.1.0.0/16")
	s := build(buildInput{settings: &settings{zones: []string{testZone}, ttl: 5}, nodes: []Node{n}})
	if got := addrsOf(entryOf(s, "local."+testZone)); got != "" {
		t.Errorf("a network address is served: %s", got)
	}
	if txt := txtOf(s, "pg1.local."+testZone); !strings.Contains(txt, "10.1.0.0/16 is a network") {
		t.Errorf("TXT: %s", txt)
	}
	// inet '10.1.0.0/0' is a network too, however short its mask.
	n.Network = netip.MustParsePrefix("10.1.0.0/0")
	s = build(buildInput{settings: &settings{zones: []string{testZone}, ttl: 5}, nodes: []Node{n}})
	if got := addrsOf(entryOf(s, "local."+testZone)); got != "" {
		t.Errorf("a /0 network is served: %s", got)
	}
	// A host is a host.
	n.Network = netip.Prefix{}
	s = build(buildInput{settings: &settings{zones: []string{testZone}, ttl: 5}, nodes: []Node{n}})
	if got := addrsOf(entryOf(s, "local."+testZone)); got != "10.1.0.0" {
		t.Errorf("10.1.0.0/32 is a host: %q", got)
	}
}

// While a node stays stale, the content hash (so the serial) and the verdicts
// (so the log) stay the same: only TXT's detail shows the age.
func TestStaleVerdictStable(t *testing.T) {
	in := buildInput{settings: &settings{zones: []string{testZone}, ttl: 5, staleAfter: 10 * time.Second}, nodes: testNodes()}
	in.nodes[1].HeartbeatAge = 11 * time.Second
	a := build(in)
	in.nodes = testNodes()
	in.nodes[1].HeartbeatAge = 47 * time.Second
	b := build(in)
	if a.hash != b.hash {
		t.Error("a stale node growing older changed the content hash: the serial would churn")
	}
	if va, vb := a.verdict("local/pg2"), b.verdict("local/pg2"); va != vb || va != "out (stale)" {
		t.Errorf("verdicts %q then %q: want the same stable words", va, vb)
	}
	if txt := txtOf(b, "pg2.local."+testZone); !strings.Contains(txt, "heartbeat 47s old") {
		t.Errorf("TXT still shows the age: %s", txt)
	}
	// A heartbeat read from the registry is shown as the time it was
	// written, which stays true while the node stays out: a cluster is built
	// again only when something in it changes.
	at := time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.UTC)
	in.nodes = testNodes()
	in.nodes[1].HeartbeatAge, in.nodes[1].Heartbeat = 11*time.Second, at
	c := build(in)
	in.nodes[1].HeartbeatAge = time.Hour
	d := build(in)
	want := "heartbeat 2026-12-01T10:00:00.123Z, older than stale_after 10s"
	if tc, td := txtOf(c, "pg2.local."+testZone), txtOf(d, "pg2.local."+testZone); tc != td || !strings.Contains(tc, want) {
		t.Errorf("TXT %s then %s: want both to say %q", tc, td, want)
	}
}

// A role is trimmed and folded: 'Primary ' is a primary.
func TestRoleTrimmed(t *testing.T) {
	s := build(buildInput{settings: &settings{zones: []string{testZone}, ttl: 5}, nodes: []Node{node("local", "pg1", "192.0.2.1", " Primary ")}})
	if got := addrsOf(entryOf(s, "primary.local."+testZone)); got != "192.0.2.1" {
		t.Errorf("' Primary ' should be the primary: %q", got)
	}
}

// A self option naming a node the registry lacks is warned about once, not at
// every load, and again only after the node came and went.
func TestSelfUnknownNodeWarnsOnce(t *testing.T) {
	logs := captureLog(t)
	pb := newPublisher(&settings{zones: []string{testZone}, ttl: 5,
		self: map[string]netip.Addr{"pg9": netip.MustParseAddr("192.0.2.99"), "local/pg1": netip.MustParseAddr("192.0.2.98")}}, nil, false)
	pb.apply(testNodes(), nil)
	pb.apply(testNodes(), nil)
	if n := strings.Count(logs.String(), "self pg9: no such node"); n != 1 {
		t.Errorf("warned %d times about self pg9, want once:\n%s", n, logs)
	}
	if strings.Contains(logs.String(), "self local/pg1") {
		t.Errorf("local/pg1 exists:\n%s", logs)
	}
	pb.apply(append(testNodes(), node("other", "pg9", "127.0.0.9", "standby")), nil)
	pb.apply(testNodes(), nil)
	if n := strings.Count(logs.String(), "self pg9: no such node"); n != 2 {
		t.Errorf("warned %d times about self pg9, want twice (it came and went):\n%s", n, logs)
	}
}
