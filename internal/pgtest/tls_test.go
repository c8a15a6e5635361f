package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcluster/pgcluster/internal/tlstest"
)

// TestTLS: a server started with Options.TLS accepts sslmode=verify-full
// against its CA and the session is encrypted (pg_stat_ssl); SetTLS swaps
// the certificate at run time, after which the first CA no longer
// verifies it; a standby made with Options.TLS presents its own.
func TestTLS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ca, other := tlstest.New(t, "pgtest CA"), tlstest.New(t, "other CA")
	pair := ca.MustIssue(t, DefaultHost)
	p := New(t, Options{TLS: &TLS{pair.CertPEM, pair.KeyPEM}})
	caFile := ca.MustWrite(t, pair).CA
	otherFile := other.MustWrite(t, pair).CA

	verifyFull := func(p *Postgres, root string) (bool, error) {
		dsn := fmt.Sprintf("postgres://postgres@%s:%d/postgres?sslmode=verify-full&sslrootcert=%s", p.Host, p.Port, root)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			return false, err
		}
		defer conn.Close(ctx)
		var ssl bool
		err = conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl)
		return ssl, err
	}
	if ssl, err := verifyFull(p, caFile); err != nil || !ssl {
		t.Fatalf("verify-full against the server's CA: ssl %v, %v", ssl, err)
	}
	if _, err := verifyFull(p, otherFile); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("verify-full against another CA: %v, want unknown authority", err)
	}
	p.MustExec(t, "SELECT 1") // sslmode=disable still works

	swapped := other.MustIssue(t, DefaultHost)
	if err := p.SetTLS(ctx, TLS{swapped.CertPEM, swapped.KeyPEM}); err != nil {
		t.Fatal(err)
	}
	if _, err := verifyFull(p, caFile); err == nil {
		t.Fatal("after SetTLS with another CA's certificate, the first CA still verifies the server")
	}
	if ssl, err := verifyFull(p, otherFile); err != nil || !ssl {
		t.Fatalf("after SetTLS, verify-full against the new CA: ssl %v, %v", ssl, err)
	}

	s := NewStandby(t, p, Options{TLS: &TLS{pair.CertPEM, pair.KeyPEM}})
	if ssl, err := verifyFull(s, caFile); err != nil || !ssl {
		t.Fatalf("standby with Options.TLS: ssl %v, %v", ssl, err)
	}
}

// TestPrependHBA: a scram-sha-256 line put first makes a role log in with
// its password only; a line pg_hba.conf cannot read is refused and the file
// left as it was.
func TestPrependHBA(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := New(t)
	p.MustExec(t, "CREATE ROLE dns LOGIN PASSWORD 'right-password'")
	connect := func(password string) error {
		conn, err := pgx.Connect(ctx, fmt.Sprintf("postgres://dns:%s@%s:%d/postgres?sslmode=disable", password, p.Host, p.Port))
		if err == nil {
			conn.Close(ctx)
		}
		return err
	}
	if err := connect("wrong"); err != nil {
		t.Fatalf("before PrependHBA every loopback login is trusted: %v", err)
	}
	if err := p.PrependHBA(ctx, "host all dns 127.0.0.0/8 scram-sha-256"); err != nil {
		t.Fatal(err)
	}
	if err := connect("wrong"); err == nil || !strings.Contains(err.Error(), "password authentication failed") {
		t.Fatalf("wrong password after PrependHBA: %v, want password authentication failed", err)
	}
	if err := connect("right-password"); err != nil {
		t.Fatalf("right password after PrependHBA: %v", err)
	}
	if err := p.PrependHBA(ctx, "host all dns 127.0.0.0/8 no-such-method"); err == nil {
		t.Fatal("an unreadable pg_hba.conf line was accepted")
	}
	if err := connect("right-password"); err != nil {
		t.Fatalf("after a refused line: %v", err)
	}
}
