package redistest

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// Start starts a redis-server for the test with StartProcess, in a
// temporary directory, its output in the test log, and stops it when the
// test ends (thawing it first when it is frozen). A redis-server that is
// missing or cannot start fails the test: tests that need Redis never skip.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := StartProcess(t.TempDir(), testLog{t})
	if err != nil {
		t.Fatalf("this test needs a real redis-server and could not start one: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Client returns a client of the server with ContextTimeoutEnabled (over
// TLS for a server started with StartTLS), closed when the test ends. It
// follows the server across Stop and Start.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: s.tls, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
