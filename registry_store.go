package pgcluster

import (
	"strings"
	"sync"
	"time"
)

// lastLoads keeps each registry's last successful load across Corefile
// reloads, so that a new instance answers from it at once, even while the
// registry is unreachable, then follows the registry as usual.
//
// Caddy starts the new instance before it shuts the old one down
// (caddy.Instance.Restart), but either order works: an entry outlives its
// last user until the next instance starts (use), which takes it if its DSN
// and zones match; only then are the entries that no instance uses dropped.
// So the store holds the live instances' entries and at most those released
// since the last start.
var lastLoads = &loadStore{entries: map[string]*storeEntry{}}

// lastLoad is one registry's rows as last loaded.
type lastLoad struct {
	rows     rowSet
	loadedAt time.Time
}

type loadStore struct {
	mu      sync.Mutex
	entries map[string]*storeEntry
}

type storeEntry struct {
	last  *lastLoad // nil until a load
	users int       // live registries that use this entry
}

// storeKey names a registry's entry: rows are only carried over to an
// instance with the same DSN and zones.
func storeKey(dsn string, zones []string) string {
	return dsn + "\x00" + strings.Join(zones, " ")
}

// use makes the caller a user of key's entry and returns its last load, or
// nil. Entries no one else uses are dropped: their instances are gone, and
// this start was the chance a successor had to take them.
func (s *loadStore) use(key string) *lastLoad {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[key]
	if e == nil {
		e = &storeEntry{}
		s.entries[key] = e
	}
	e.users++
	for k, other := range s.entries {
		if other.users == 0 {
			delete(s.entries, k)
		}
	}
	return e.last
}

// restore makes the caller a user of key's entry (see use; kept is set:
// the caller releases it when it stops) and returns its last load and,
// when there is one, the full update that serves it again (heartbeat ages
// as loaded). The registry and the relay restore through it alike. A key
// of "" keeps nothing.
func (s *loadStore) restore(key string, kept *bool) (rowsUpdate, *lastLoad) {
	if key == "" {
		return rowsUpdate{}, nil
	}
	*kept = true
	last := s.use(key)
	if last == nil {
		return rowsUpdate{}, nil
	}
	return last.rows.update(last.loadedAt), last
}

// keep records a successful load for key's users. rows' maps are kept as
// they are: the caller replaces them, never changes them (see rowSet).
func (s *loadStore) keep(key string, rows rowSet, loadedAt time.Time) {
	l := &lastLoad{rows: rows, loadedAt: loadedAt}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entries[key]; e != nil {
		e.last = l
	}
}

// release ends the caller's use of key's entry. An entry left unused stays
// until the next use, for an instance that replaces the caller.
func (s *loadStore) release(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.entries[key]; e != nil && e.users > 0 {
		e.users--
	}
}
