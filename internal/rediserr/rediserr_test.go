package rediserr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/redistest"
	"github.com/pgcluster/pgcluster/internal/tlstest"
)

// client is a client as pgcluster makes one (redis_client.go): dials bound
// by 500 ms, callers' deadlines honoured. Its failed connections are
// watched.
func client(t *testing.T, o *redis.Options) (*redis.Client, *Dials) {
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout = 500*time.Millisecond, 3*time.Second, 3*time.Second
	o.ContextTimeoutEnabled = true
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c, Watch(c)
}

// call is a call as lock/ makes one: 500 ms for the whole of it. It
// returns the error explained.
func call(t *testing.T, c *redis.Client, d *Dials) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err := c.Ping(ctx).Err()
	if err == nil {
		t.Fatal("PING succeeded")
	}
	return d.Explain(err)
}

// wantText fails the test unless every call of three explains its failure
// with all of wants: the explanation does not depend on where in
// go-redis's redials the deadline fell.
func wantText(t *testing.T, c *redis.Client, d *Dials, wants ...string) {
	t.Helper()
	for range 3 {
		err := call(t, c, d)
		for _, w := range wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("explained as\n%v\nwant %q in it", err, w)
			}
		}
	}
}

// TestExplainRefused: a stopped Redis. go-redis's own error is "context
// deadline exceeded": the call's deadline passed while it redialled.
func TestExplainRefused(t *testing.T) {
	s := redistest.Start(t)
	c, d := client(t, &redis.Options{Addr: s.Addr()})
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	wantText(t, c, d, "connection refused at "+s.Addr()+": no Redis listens there; check that Redis runs, and the host and port of the redis URL; retrying (")
	// A client that never reached it says the same.
	cold, d := client(t, &redis.Options{Addr: s.Addr()})
	err := call(t, cold, d)
	if !strings.HasPrefix(err.Error(), "connection refused at "+s.Addr()) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a new client: %v (errors.Is DeadlineExceeded: %v)", err, errors.Is(err, context.DeadlineExceeded))
	}
	t.Logf("stopped Redis: %v", err)
}

// TestExplainAuthFailed: a wrong password, and none where Redis wants one.
func TestExplainAuthFailed(t *testing.T) {
	s := redistest.Start(t)
	if err := s.Client(t).ConfigSet(t.Context(), "requirepass", "right").Err(); err != nil {
		t.Fatal(err)
	}
	c, d := client(t, &redis.Options{Addr: s.Addr(), Password: "wrong"})
	wantText(t, c, d, "Redis refused the user and password (authentication failed); check the password (and user) in the redis URL", "(WRONGPASS ")
	c, d = client(t, &redis.Options{Addr: s.Addr(), Username: "nobody", Password: "right"})
	wantText(t, c, d, "Redis refused the user and password (authentication failed)")
	c, d = client(t, &redis.Options{Addr: s.Addr()})
	wantText(t, c, d, "Redis wants a password and the redis URL gives none (authentication failed); give it in the URL: redis://:PASSWORD@HOST:PORT", "(NOAUTH ")
	t.Logf("no password: %v", call(t, c, d))
}

// TestExplainTLS: a certificate from a CA this host does not trust, one
// for another name, redis:// to a Redis that speaks TLS only, a wrong
// password over TLS, and rediss:// to a Redis that does not speak TLS.
func TestExplainTLS(t *testing.T) {
	ca := tlstest.New(t, "redis CA")
	files := ca.MustWrite(t, ca.MustIssue(t, "127.0.0.1"))
	ts := redistest.StartTLS(t, redistest.TLS{CertFile: files.Cert, KeyFile: files.Key, CAFile: files.CA, Client: ca.ClientConfig()})

	c, d := client(t, &redis.Options{Addr: ts.Addr(), TLSConfig: tlstest.New(t, "other CA").ClientConfig()})
	wantText(t, c, d, "Redis's TLS certificate is signed by an authority this host does not trust (TLS); add the CA that signed it to this host's CA bundle (update-ca-certificates, or SSL_CERT_FILE)",
		"certificate signed by unknown authority")
	t.Logf("unknown CA: %v", call(t, c, d))

	wrongName := ca.ClientConfig()
	wrongName.ServerName = "redis.example"
	c, d = client(t, &redis.Options{Addr: ts.Addr(), TLSConfig: wrongName})
	wantText(t, c, d, "Redis's TLS certificate is not for the host the redis URL names (TLS)")

	c, d = client(t, &redis.Options{Addr: ts.Addr()})
	wantText(t, c, d, "Redis closed the connection; it restarted, reached maxclients, or serves TLS only (then write rediss://)")
	t.Logf("redis:// to TLS: %v", call(t, c, d))

	// Over TLS, a wrong password is a wrong password.
	if err := ts.Client(t).ConfigSet(t.Context(), "requirepass", "right").Err(); err != nil {
		t.Fatal(err)
	}
	c, d = client(t, &redis.Options{Addr: ts.Addr(), TLSConfig: ca.ClientConfig(), Password: "wrong"})
	wantText(t, c, d, "Redis refused the user and password (authentication failed)")

	plain := redistest.Start(t)
	c, d = client(t, &redis.Options{Addr: plain.Addr(), TLSConfig: ca.ClientConfig()})
	// The handshake's dial ends at its own timeout, which may come after
	// the first call's deadline: the calls after it are described.
	call(t, c, d)
	deadline := time.Now().Add(5 * time.Second)
	for d.recent() == nil && time.Now().Before(deadline) {
		call(t, c, d)
	}
	wantText(t, c, d, "no connection to Redis could be set up in time (timed out connecting); a rediss:// URL to a Redis without TLS never completes the TLS handshake (write redis://)")
	t.Logf("rediss:// to plain: %v", call(t, c, d))
}

// TestExplainTimedOut: a frozen Redis accepts connections and answers
// nothing.
func TestExplainTimedOut(t *testing.T) {
	s := redistest.Start(t)
	c, d := client(t, &redis.Options{Addr: s.Addr()})
	if err := c.Ping(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Freeze(); err != nil {
		t.Fatal(err)
	}
	defer s.Thaw()
	wantText(t, c, d, "Redis did not answer in time (timed out); it is stopped (SIGSTOP), overloaded, or the network drops packets to it; retrying (context deadline exceeded)")
}

// TestDescribe: errors made here, as a resolver and a caller's wrapping
// make them (no DNS server is asked), and an error it does not know.
func TestDescribe(t *testing.T) {
	notFound := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "redis.internal", IsNotFound: true}}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{notFound, "the host name redis.internal does not resolve (DNS: no such host); check the host in the redis URL, and this host's resolver (dial tcp: lookup redis.internal: no such host)"},
		{&net.DNSError{Err: "server misbehaving", Name: "redis.internal", IsTemporary: true}, "the host name redis.internal could not be resolved (DNS failed)"},
		// Formatted with %v: the types are gone, the text is enough.
		{fmt.Errorf("lease of x: %v", notFound), "the redis URL's host name does not resolve (DNS: no such host)"},
		{fmt.Errorf("a Redis call failed: %v", errors.New("WRONGPASS invalid username-password pair or user is disabled.")), "Redis refused the user and password (authentication failed)"},
		{errors.New("the registry copy keeps changing under the follower"), "the registry copy keeps changing under the follower"},
		// Quoted: what was read from Redis, anyone's write.
		{fmt.Errorf("malformed: member entry %q without a token", "WRONGPASS connection refused tls: x"), `malformed: member entry "WRONGPASS connection refused tls: x" without a token`},
	} {
		if got := Describe(tc.err); !strings.Contains(got, tc.want) || strings.Contains(tc.want, "malformed") && got != tc.want {
			t.Errorf("Describe(%v)\n= %s\nwant %s", tc.err, got, tc.want)
		}
	}
	if Describe(nil) != "" || (*Dials)(nil).Explain(nil) != nil {
		t.Error("nil is described")
	}
	e := (*Dials)(nil).Explain(notFound)
	if (*Dials)(nil).Explain(e) != e {
		t.Error("an explained error is explained again")
	}
}
