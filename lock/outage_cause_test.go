package lock

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/redistest"
	"github.com/pgcluster/pgcluster/internal/tlstest"
)

// An instance that cannot speak to Redis says why, even when its first
// call only ran out of time: a redis-server that accepts TLS only, with a
// certificate from a CA this instance does not trust, reached through a
// dialer whose first connection hangs (a TLS handshake refused after a few
// retries can take longer than the first call's deadline on a loaded
// machine). Local mode begins on that deadline; the line that names the
// certificate refused follows at the next call that fails otherwise.
func TestLocalModeSaysWhy(t *testing.T) {
	ca := tlstest.New(t, "redis CA")
	files := ca.MustWrite(t, ca.MustIssue(t, "127.0.0.1"))
	srv := redistest.StartTLS(t, redistest.TLS{CertFile: files.Cert, KeyFile: files.Key, CAFile: files.CA, Client: ca.ClientConfig()})
	untrusting := tlstest.New(t, "other CA").ClientConfig()
	untrusting.ServerName = "127.0.0.1"
	var dials atomic.Int64
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true,
		DialTimeout: MaxCallTimeout, ReadTimeout: MaxCallTimeout, WriteTimeout: MaxCallTimeout,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if dials.Add(1) == 1 {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			d := tls.Dialer{Config: untrusting}
			return d.DialContext(ctx, network, addr)
		}})
	t.Cleanup(func() { rdb.Close() })
	logs := &lineLog{t: t}
	in := startInstance(t, rdb, nil, func(cfg *Config) { cfg.Logf = logs.logf })
	const why = "x509: certificate signed by unknown authority"
	told := func() []string {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		var out []string
		for _, line := range logs.lines {
			if strings.Contains(line, "Redis does not answer") {
				out = append(out, line)
			}
		}
		return out
	}
	eventually(t, 10*time.Second, "a line saying Redis does not answer because its certificate is refused", func() bool {
		lines := told()
		return len(lines) > 0 && strings.Contains(lines[len(lines)-1], why)
	})
	if m := in.coord.Mode(); m != ModeLocal {
		t.Errorf("mode %q, want %q", m, ModeLocal)
	}
	lines := told()
	if !strings.Contains(lines[0], "deadline") {
		t.Fatalf("the first call did not run out of time (lines %q): the test shows nothing", lines)
	}
	if len(lines) != 2 {
		t.Errorf("lines saying Redis does not answer: %q, want the deadline's and then one naming %q", lines, why)
	}
}
