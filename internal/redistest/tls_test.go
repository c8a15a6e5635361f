package redistest

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/tlstest"
)

// A TLS server answers over TLS with a client trusting its CA (Client,
// URL rediss://), survives Stop and Start on its port, and refuses plain
// TCP and a client that trusts another CA.
func TestTLS(t *testing.T) {
	ca := tlstest.New(t, "redistest CA")
	files := ca.MustWrite(t, ca.MustIssue(t, "127.0.0.1"))
	s := StartTLS(t, TLS{CertFile: files.Cert, KeyFile: files.Key, CAFile: files.CA, Client: ca.ClientConfig()})
	if want := "rediss://" + s.Addr(); s.URL() != want {
		t.Errorf("URL() = %q, want %q", s.URL(), want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.Client(t).Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("over TLS: %v", err)
	}
	try := func(tlsc *tls.Config) error {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: tlsc, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
		defer c.Close()
		return c.Ping(ctx).Err()
	}
	if err := try(nil); err == nil {
		t.Error("plain TCP to the TLS port answered PING")
	}
	if err := try(tlstest.New(t, "other CA").ClientConfig()); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Errorf("a client trusting another CA: %v, want unknown authority", err)
	}
	s.Stop()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := ping(s, 5*time.Second); err != nil {
		t.Fatalf("restarted TLS server: %v", err)
	}
	if _, err := StartTLSProcess(t.TempDir(), nil, TLS{CertFile: files.Cert}); err == nil {
		t.Error("StartTLSProcess without key, CA and client configuration started")
	}
}
