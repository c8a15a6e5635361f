package pgcluster

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/proc"
)

// connectedHost names the server a session is connected to: with a
// multi-host DSN whose first host refuses (or is a standby, under
// target_session_attrs=read-write), the host that took the session; over
// a Unix socket, its directory and port.
func TestConnectedHost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	primary := pgtest.New(t, pgtest.Options{Host: "127.0.0.2"})
	standby := pgtest.NewStandby(t, primary, pgtest.Options{Host: "127.0.0.3"})
	closed, err := proc.FreePort() // nothing listens there
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, dsn, want string
	}{
		{"one host", fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres sslmode=disable", primary.Host, primary.Port),
			primary.HostPort() + "/postgres"},
		{"first host refuses", fmt.Sprintf("host=127.0.0.1,%s port=%d,%d user=postgres dbname=postgres sslmode=disable", primary.Host, closed, primary.Port),
			primary.HostPort() + "/postgres"},
		{"first host a standby, read-write wanted", fmt.Sprintf("host=%s,%s port=%d,%d user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write",
			standby.Host, primary.Host, standby.Port, primary.Port), primary.HostPort() + "/postgres"},
		{"first host a standby, standby wanted", fmt.Sprintf("host=%s,%s port=%d,%d user=postgres dbname=template1 sslmode=disable target_session_attrs=standby",
			primary.Host, standby.Host, primary.Port, standby.Port), standby.HostPort() + "/template1"},
		{"unix socket", fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", primary.Dir, primary.Port),
			fmt.Sprintf("%s:%d/postgres", primary.Dir, primary.Port)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := pgx.Connect(ctx, tc.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if got := connectedRegistry(conn); got != tc.want {
				t.Errorf("connectedRegistry = %q, want %q (redact(dsn) says %q)", got, tc.want, redact(tc.dsn))
			}
		})
	}
	if connectedHost(nil) != "" || connectedRegistry(nil) != "" {
		t.Error("no connection: want \"\"")
	}
}
