package discovery

import (
	"context"
	"sync"
	"time"
)

// memo shares one computation between concurrent callers asking for the
// same key, and keeps a successful result until it expires. The computation
// runs detached from any caller's context, so a caller giving up does not
// fail the others.
type memo[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]*memoEntry[V]
}

type memoEntry[V any] struct {
	done    chan struct{}
	v       V
	err     error
	expires time.Time
}

// get returns the value for key, computing it with fn when there is none
// fresh; keep tells how long a successful value stays fresh.
func (m *memo[K, V]) get(ctx context.Context, key K, keep func(V) time.Duration, fn func(context.Context) (V, error)) (V, error) {
	m.mu.Lock()
	if m.m == nil {
		m.m = make(map[K]*memoEntry[V])
	}
	e := m.m[key]
	if e == nil || e.stale(time.Now()) {
		m.sweep()
		e = &memoEntry[V]{done: make(chan struct{})}
		m.m[key] = e
		go m.fill(context.WithoutCancel(ctx), key, e, keep, fn)
	}
	m.mu.Unlock()
	select {
	case <-e.done:
		return e.v, e.err
	case <-ctx.Done():
		var zero V
		return zero, context.Cause(ctx)
	}
}

func (m *memo[K, V]) fill(ctx context.Context, key K, e *memoEntry[V], keep func(V) time.Duration, fn func(context.Context) (V, error)) {
	v, err := fn(ctx)
	m.mu.Lock()
	e.v, e.err = v, err
	if err == nil {
		e.expires = time.Now().Add(keep(v))
	}
	close(e.done)
	if err != nil && m.m[key] == e {
		delete(m.m, key)
	}
	m.mu.Unlock()
}

// stale reports whether e is finished and expired. Called with m.mu held.
func (e *memoEntry[V]) stale(now time.Time) bool {
	select {
	case <-e.done:
		return !now.Before(e.expires)
	default:
		return false
	}
}

// sweep drops expired entries. Called with m.mu held.
func (m *memo[K, V]) sweep() {
	now := time.Now()
	for k, e := range m.m {
		if e.stale(now) {
			delete(m.m, k)
		}
	}
}

// reset forgets every value; computations in flight still reach their
// callers but are not kept.
func (m *memo[K, V]) reset() {
	m.mu.Lock()
	clear(m.m)
	m.mu.Unlock()
}
