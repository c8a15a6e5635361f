package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestStartStopStart(t *testing.T) {
	p := New(t)
	p.MustExec(t, "CREATE TABLE t(x int); INSERT INTO t VALUES (1)")
	if err := p.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := p.Exec(context.Background(), "SELECT 1"); err == nil {
		t.Fatal("stopped server still answers")
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(context.Background(), p.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var x int
	if err := conn.QueryRow(context.Background(), "SELECT x FROM t").Scan(&x); err != nil || x != 1 {
		t.Fatalf("after restart: x=%d err=%v", x, err)
	}
}
