package coretest

import (
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Backend is a node as check tcp sees it: a TCP listener on a loopback
// address that accepts every connection and closes it at once, noting when.
// Closed, its connections are refused; opened again, it listens on the same
// address. It is closed when the test ends.
type Backend struct {
	Host string
	Port int

	mu    sync.Mutex
	l     net.Listener // nil while closed
	times []time.Time  // when each connection was accepted
}

// NewBackend listens on a free port of host.
func NewBackend(t testing.TB, host string) *Backend {
	t.Helper()
	b := &Backend{Host: host}
	if err := b.listen(net.JoinHostPort(host, "0")); err != nil {
		t.Fatalf("listen on %s: %v", host, err)
	}
	b.Port = b.l.Addr().(*net.TCPAddr).Port
	t.Cleanup(b.Close)
	return b
}

// Addr is the backend's host:port.
func (b *Backend) Addr() string { return net.JoinHostPort(b.Host, strconv.Itoa(b.Port)) }

// Accepts counts the connections accepted so far.
func (b *Backend) Accepts() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int64(len(b.times))
}

// AcceptsIn returns when the connections accepted in [from, to) were.
func (b *Backend) AcceptsIn(from, to time.Time) []time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []time.Time
	for _, at := range b.times {
		if !at.Before(from) && at.Before(to) {
			out = append(out, at)
		}
	}
	return out
}

// Closed reports whether the backend refuses connections.
func (b *Backend) Closed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.l == nil
}

// Close stops accepting: connections are refused from now on.
func (b *Backend) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.l != nil {
		b.l.Close()
		b.l = nil
	}
}

// Open accepts again on the same address; it does nothing while open.
func (b *Backend) Open(t testing.TB) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.l != nil {
		return
	}
	if err := b.listen(b.Addr()); err != nil {
		t.Fatalf("listen again on %s: %v", b.Addr(), err)
	}
}

// Toggle closes the backend when it is open, and opens it when it is not.
func (b *Backend) Toggle(t testing.TB) {
	t.Helper()
	b.mu.Lock()
	open := b.l != nil
	b.mu.Unlock()
	if open {
		b.Close()
	} else {
		b.Open(t)
	}
}

// listen listens on addr and accepts on it until the listener is closed.
// b.mu is held, or b is not shared yet.
func (b *Backend) listen(addr string) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	b.l = l
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			at := time.Now()
			c.Close()
			b.mu.Lock()
			b.times = append(b.times, at)
			b.mu.Unlock()
		}
	}()
	return nil
}
