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

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/redistest"
	"github.com/pgcluster/pgcluster/internal/tlstest"
)

// An instance that cannot speak to Redis says why, even when every call
// of the failure streak that put it in local mode only ran out of time: a
// redis-server that accepts TLS only, with a certificate from a CA this
// instance does not trust, reached through a dialer whose connections hang
// until the instance is local (a TLS handshake refused after a few retries
// can take longer than a call's deadline on a loaded machine). Local mode
// begins on deadlines; the line that names the certificate refused follows
// at the next call that fails otherwise.
func TestLocalModeSaysWhy(t *testing.T) {
	ca := tlstest.New(t, "redis CA")
	files := ca.MustWrite(t, ca.MustIssue(t, "127.0.0.1"))
	srv := redistest.StartTLS(t, redistest.TLS{CertFile: files.Cert, KeyFile: files.Key, CAFile: files.CA, Client: ca.ClientConfig()})
	untrusting := tlstest.New(t, "other CA").ClientConfig()
	untrusting.ServerName = "127.0.0.1"
	var coord atomic.Pointer[Coordinator]
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true,
		DialTimeout: MaxCallTimeout, ReadTimeout: MaxCallTimeout, WriteTimeout: MaxCallTimeout,
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if c := coord.Load(); c == nil || c.Mode() != ModeLocal {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			d := tls.Dialer{Config: untrusting}
			return d.DialContext(ctx, network, addr)
		}})
	t.Cleanup(func() { rdb.Close() })
	logs := &lineLog{t: t}
	in := startCheckedWith(t, rdb, nil, Config{Prefix: "fleet:", Interval: fleetInterval, Timeout: fleetTimeout, Resync: time.Second, Logf: logs.logf},
		health.Config{Check: health.CheckTCP, Interval: fleetInterval, Timeout: fleetTimeout, Rise: 1, Fall: 1},
		func(c *Coordinator) { coord.Store(c) })
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
		t.Fatalf("local mode did not begin on a deadline (lines %q): the test shows nothing", lines)
	}
	if len(lines) != 2 {
		t.Errorf("lines saying Redis does not answer: %q, want the deadline's and then one naming %q", lines, why)
	}
}

// A joining instance's first heartbeat is given two cycles of failed calls
// before local mode (see join), and local mode's line names what was wrong
// in any of them, not only the deadline the first one ran out of: the
// same TLS-only redis-server and untrusted CA, the first dial hanging, at
// an interval of 2 s (two cycles: 2 s, four times the first call's
// deadline). The first line saying Redis does not answer names the
// certificate refused. (Going local at the first failure, as an instance
// that never coordinated once did, said only "context deadline exceeded".)
func TestJoinSaysWhy(t *testing.T) {
	const interval = 2 * time.Second
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
	started := time.Now()
	in := startInstance(t, rdb, nil, func(cfg *Config) {
		cfg.Interval, cfg.Timeout, cfg.Logf = interval, outageTimeout, logs.logf
	})
	const why = "x509: certificate signed by unknown authority"
	var first string
	eventually(t, 10*time.Second, "a line saying Redis does not answer", func() bool {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		for _, line := range logs.lines {
			if strings.Contains(line, "Redis does not answer") {
				first = line
				return true
			}
		}
		return false
	})
	took := time.Since(started)
	t.Logf("local after %v: %s", took.Round(time.Millisecond), first)
	if m := in.coord.Mode(); m != ModeLocal {
		t.Errorf("mode %q, want %q", m, ModeLocal)
	}
	if dials.Load() < 2 {
		t.Fatalf("%d dials: the join tried Redis only once, the test shows nothing", dials.Load())
	}
	if !strings.Contains(first, why) {
		t.Errorf("the first line saying Redis does not answer is %q, want it to name %q", first, why)
	}
}
