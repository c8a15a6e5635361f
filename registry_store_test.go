package pgcluster

import (
	"testing"
	"time"
)

// Rows are kept for the next instance (a Corefile reload) before they are
// answered: an instance started once an answer was seen restores them,
// never the rows before. The registry and the relay alike.
func TestRowsKeptBeforeAnswered(t *testing.T) {
	set := &settings{zones: []string{testZone}, ttl: 5, refresh: time.Minute}
	// kept reports the address of local/pg1 in key's last load.
	kept := func(key string) string {
		lastLoads.mu.Lock()
		defer lastLoads.mu.Unlock()
		e := lastLoads.entries[key]
		if e == nil || e.last == nil {
			return ""
		}
		u := e.last.rows.update(e.last.loadedAt)
		if ns := u.nodes["local"]; len(ns) == 1 {
			return ns[0].Address.String()
		}
		return ""
	}
	rows := func(addr string) rowsUpdate {
		return rowsUpdate{full: true, nodes: map[string][]Node{"local": {node("local", "pg1", addr, "primary")}},
			aliasesSet: true, networksSet: true, loadedAt: time.Now()}
	}
	// check is the publisher's view: whenever rows are answered, the
	// last load kept holds them.
	check := func(who, key string) func(rowsUpdate) {
		return func(u rowsUpdate) {
			want := u.nodes["local"][0].Address.String()
			if got := kept(key); got != want {
				t.Errorf("%s: answering %s while the rows kept for the next instance hold %q", who, want, got)
			}
		}
	}

	t.Run("registry", func(t *testing.T) {
		key := storeKey("registry-kept-before-answered", set.zones)
		pb := newPublisher(set, nil, false)
		r := newRegistry(set, key, func(u rowsUpdate) {
			check("registry", key)(u)
			pb.applyAt(u)
		})
		r.restore() // nothing to restore; takes a place in lastLoads
		defer lastLoads.release(key)
		for _, addr := range []string{"192.0.2.1", "192.0.2.2"} {
			r.rows.merge(rows(addr), time.Now())
			now := time.Now()
			r.publish(now, now, nil, true, false, false)
		}
	})
	t.Run("relay", func(t *testing.T) {
		key := storeKey("relay-kept-before-answered", set.zones)
		pb := newPublisher(set, nil, false)
		pb.after = check("relay", key)
		r := &relay{set: set, pb: pb, key: key, loaded: make(chan struct{})}
		r.restore()
		defer lastLoads.release(key)
		for _, addr := range []string{"192.0.2.1", "192.0.2.2"} {
			r.apply(rows(addr), time.Now())
		}
	})
}
