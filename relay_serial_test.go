package pgcluster

import (
	"testing"
	"time"
)

// RFC 1982: a serial comes after another when it is less than 2^31 ahead
// of it, mod 2^32.
func TestSerialAfter(t *testing.T) {
	for _, tc := range []struct {
		a, b uint32
		want bool
	}{
		{2, 1, true},
		{1, 2, false},
		{1, 1, false},
		{0, 1<<32 - 1, true},            // across the wrap
		{1<<31 - 1, 0, true},            // the largest step forward
		{1 << 31, 0, false},             // undefined in RFC 1982: not after
		{1215752192, 1796191669, false}, // 99999999999 mod 2^32, after today's
	} {
		if got := serialAfter(tc.a, tc.b); got != tc.want {
			t.Errorf("serialAfter(%d, %d) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

// Through the relay the serial is the fleet's registry version, but it
// never goes backwards, whatever version the rows come with: one below the
// serial served (a new term's, after Redis lost the copy) or one whose
// serial RFC 1982 reads as behind (99999999999 mod 2^32) moves it by one
// when the zone changed, and not at all when it did not.
func TestRelaySerialNeverBackwards(t *testing.T) {
	set := &settings{zones: []string{testZone}, ttl: 5}
	p := &PgCluster{Zones: set.zones, ttl: set.ttl}
	pb := newPublisher(set, nil, false)
	p.pb = pb
	now := time.Now()
	apply := func(version int64, addr string) uint32 {
		pb.applyAt(rowsUpdate{full: true, nodes: map[string][]Node{"local": {node("local", "pg1", addr, "primary")}},
			aliasesSet: true, loadedAt: now, version: version})
		return p.snapshot().serial
	}
	const v = 1796191669
	steps := []struct {
		version int64
		addr    string
		want    uint32
	}{
		{v, "192.0.2.1", v},
		{v + 1, "192.0.2.2", v + 1},                  // the next version
		{v - 100, "192.0.2.3", v + 2},                // a version below: one up
		{v - 99, "192.0.2.3", v + 2},                 // below, nothing changed: kept
		{99999999999, "192.0.2.4", v + 3},            // behind by RFC 1982: one up
		{v + 10, "192.0.2.5", v + 10},                // a later version again
		{int64(v) + 10 + 1<<31, "192.0.2.6", v + 11}, // 2^31 ahead: undefined, one up
	}
	for i, s := range steps {
		if got := apply(s.version, s.addr); got != s.want {
			t.Errorf("step %d, version %d: serial %d, want %d", i, s.version, got, s.want)
		}
	}
}
