package pgtest

import (
	"context"
	"testing"
)

// New starts a PostgreSQL server for the test and stops it when the test ends.
// A server that cannot start fails the test, saying what is missing: tests that
// need PostgreSQL never skip.
func New(t testing.TB, opts ...Options) *Postgres {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	p, err := Start(o)
	if err != nil {
		t.Fatalf("this test needs a real PostgreSQL server and could not start one: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// MustExec runs SQL and fails the test on error.
func (p *Postgres) MustExec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if err := p.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}

// NewStandby makes a streaming standby of primary with StartStandby for the
// test, and stops it and removes its directory when the test ends. A standby
// that cannot start or stream fails the test.
func NewStandby(t testing.TB, primary *Postgres, opts ...Options) *Postgres {
	t.Helper()
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	p, err := StartStandby(primary, o)
	if err != nil {
		t.Fatalf("this test needs a PostgreSQL standby and could not make one: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}
