// Package rediserr says what a failed Redis call means in an operator's
// words: the connection was refused, timed out, the password or the TLS
// certificate was refused, the host name does not resolve. go-redis's own
// errors often hide that: a call to a stopped Redis fails with "context
// deadline exceeded" once its deadline passes during go-redis's redials,
// the "connection refused" of each redial seen by no one. Dials records
// those, so that a timed-out call is described by its real cause.
package rediserr

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// failFresh is how long a failed connection describes the calls that time
// out after it: a connection is tried again at each call that finds none,
// so an older failure says nothing of a call now.
const failFresh = 5 * time.Second

// Dials is a go-redis hook that records a client's last failed connection
// (a dial, or a connection that Redis closed), until Redis answers a
// command. Its methods are safe for concurrent use; a nil *Dials describes
// errors as Describe does.
type Dials struct {
	last atomic.Pointer[failure]
}

// failure is a failed connection.
type failure struct {
	err  error
	dial bool // the dial itself failed
	at   time.Time
}

// Watch records the failed connections of c (of every node, for a cluster
// client).
func Watch(c redis.UniversalClient) *Dials {
	d := &Dials{}
	c.AddHook(d)
	if cc, ok := c.(*redis.ClusterClient); ok {
		// A cluster's nodes are clients of their own: their dials are
		// theirs, not the cluster client's.
		cc.OnNewNode(func(n *redis.Client) { n.AddHook(d) })
	}
	return d
}

// DialHook records each failed dial. A dial that succeeds does not clear
// the last failure: a server may accept the connection and close it at the
// first command (a redis:// URL to a Redis that speaks TLS only).
func (d *Dials) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		d.note(err, true)
		return conn, err
	}
}

// ProcessHook records a connection that failed under a command (Redis
// closed it: a redis:// URL to a Redis that speaks TLS only, a restart).
func (d *Dials) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		d.note(err, false)
		return err
	}
}

// ProcessPipelineHook records a connection that failed under a pipeline,
// as ProcessHook does.
func (d *Dials) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		d.note(err, false)
		return err
	}
}

// note records err, a dial's or a command's outcome. Redis's replies,
// errors included, mean that it answers: the failure before them is
// forgotten. A command's timeout is not a cause of its own: the failure
// before it, if any, is kept to describe it.
func (d *Dials) note(err error, dial bool) {
	var reply redis.Error
	switch {
	case err == nil && dial:
	case err == nil || errors.As(err, &reply):
		if d.last.Load() != nil {
			d.last.Store(nil)
		}
	case !dial && timedOut(err):
	default:
		d.last.Store(&failure{err: err, dial: dial, at: time.Now()})
	}
}

// recent is the failed connection that explains a call timing out now, if
// any.
func (d *Dials) recent() *failure {
	if d == nil {
		return nil
	}
	f := d.last.Load()
	if f == nil || time.Since(f.at) > failFresh {
		return nil
	}
	return f
}

// Explain returns err described (see Describe), still wrapping err for
// errors.Is and errors.As; a call that timed out after a failed connection
// is described by that failure. nil stays nil.
func (d *Dials) Explain(err error) error {
	if err == nil {
		return nil
	}
	var ex *explained
	if errors.As(err, &ex) {
		return err // described already
	}
	p, ok := describe(err)
	text := err.Error()
	if f := d.recent(); f != nil && timedOut(err) {
		if f.dial {
			text += "; the dial before it: " + f.err.Error()
		} else {
			text += "; the connection before it: " + f.err.Error()
		}
		if f.dial && timedOut(f.err) {
			p, ok = problem{"no connection to Redis could be set up in time (timed out connecting)",
				"a rediss:// URL to a Redis without TLS never completes the TLS handshake (write redis://); otherwise Redis is frozen, overloaded, or the network drops packets to it; retrying"}, true
		} else if fp, fok := describe(f.err); fok {
			p, ok = fp, true
		}
	}
	if !ok {
		return err
	}
	return &explained{err: err, text: p.what + "; " + p.todo + " (" + text + ")"}
}

// Describe returns what err means and what to do about it, followed by err
// itself in brackets; an error it does not recognise is returned as it is.
func Describe(err error) string {
	if err == nil {
		return ""
	}
	return (*Dials)(nil).Explain(err).Error()
}

// explained is an error with its description.
type explained struct {
	err  error
	text string
}

func (e *explained) Error() string { return e.text }
func (e *explained) Unwrap() error { return e.err }

// problem is what went wrong with Redis, and what to do about it.
type problem struct{ what, todo string }

// describe says what err means, when it is one of the failures an operator
// can act on. It reads the error's types, and its text when a caller
// formatted it with %v rather than wrapped it; not the text's quoted parts,
// which hold what was read from Redis (anyone's write), not what happened.
func describe(err error) (problem, bool) {
	msg := quotedText.ReplaceAllString(err.Error(), `""`)
	var dnsErr *net.DNSError
	var unknownCA x509.UnknownAuthorityError
	var badName x509.HostnameError
	var invalid x509.CertificateInvalidError
	var record tls.RecordHeaderError
	var alert tls.AlertError
	switch {
	case strings.Contains(msg, "WRONGPASS"):
		return problem{"Redis refused the user and password (authentication failed)",
			"check the password (and user) in the redis URL, redis://USER:PASSWORD@HOST:PORT, against Redis's requirepass or ACL users; percent-encode reserved characters in it"}, true
	case strings.Contains(msg, "NOAUTH"):
		return problem{"Redis wants a password and the redis URL gives none (authentication failed)",
			"give it in the URL: redis://:PASSWORD@HOST:PORT, or redis://USER:PASSWORD@HOST:PORT for an ACL user"}, true
	case strings.Contains(msg, "NOPERM"):
		return problem{"Redis denies the redis URL's user a command pgcluster needs (permission denied)",
			"let the user run the commands and keys the error names (ACL SETUSER); see the documentation of redis_prefix for the keys"}, true
	case errors.As(err, &unknownCA) || strings.Contains(msg, "certificate signed by unknown authority"):
		return problem{"Redis's TLS certificate is signed by an authority this host does not trust (TLS)",
			"add the CA that signed it to this host's CA bundle (update-ca-certificates, or SSL_CERT_FILE)"}, true
	case errors.As(err, &badName) || strings.Contains(msg, "x509: certificate is valid for") || strings.Contains(msg, "x509: certificate is not valid for any names"):
		return problem{"Redis's TLS certificate is not for the host the redis URL names (TLS)",
			"connect by a name or address the certificate holds, or issue one for the URL's host"}, true
	case errors.As(err, &invalid) || strings.Contains(msg, "x509: certificate has expired"):
		return problem{"Redis's TLS certificate is not valid (TLS: expired, not yet valid, or not for a server)",
			"renew Redis's certificate"}, true
	case errors.As(err, &record) || strings.Contains(msg, "first record does not look like a TLS handshake"):
		return problem{"the server at the redis URL's address does not speak TLS (TLS handshake failed)",
			"write redis:// for a Redis without TLS, or give the port of its tls-port"}, true
	case errors.As(err, &alert) || strings.Contains(msg, "tls: "):
		return problem{"the TLS handshake with Redis failed (TLS)",
			"check Redis's tls-* settings: it may want a client certificate (tls-auth-clients), which pgcluster does not present"}, true
	case errors.As(err, &dnsErr):
		if dnsErr.IsNotFound {
			return problem{"the host name " + dnsErr.Name + " does not resolve (DNS: no such host)",
				"check the host in the redis URL, and this host's resolver"}, true
		}
		return problem{"the host name " + dnsErr.Name + " could not be resolved (DNS failed)",
			"check this host's resolver (/etc/resolv.conf); retrying"}, true
	case strings.Contains(msg, "no such host"):
		return problem{"the redis URL's host name does not resolve (DNS: no such host)",
			"check the host in the redis URL, and this host's resolver"}, true
	case errors.Is(err, syscall.ECONNREFUSED) || strings.Contains(msg, "connection refused"):
		return problem{"connection refused" + at(err) + ": no Redis listens there",
			"check that Redis runs, and the host and port of the redis URL; retrying"}, true
	case errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		strings.Contains(msg, "no route to host") || strings.Contains(msg, "network is unreachable"):
		return problem{"Redis is unreachable" + at(err) + " (no route)",
			"check the host of the redis URL and the network to it; retrying"}, true
	case errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.Contains(msg, "connection reset") || msg == "EOF":
		return problem{"Redis closed the connection",
			"it restarted, reached maxclients, or serves TLS only (then write rediss://); retrying"}, true
	case timedOut(err):
		return problem{"Redis did not answer in time (timed out)",
			"it is stopped (SIGSTOP), overloaded, or the network drops packets to it; retrying"}, true
	case strings.HasPrefix(msg, "LOADING"):
		return problem{"Redis is loading its data set", "wait: retrying until it is loaded"}, true
	case strings.HasPrefix(msg, "READONLY"):
		return problem{"the redis URL names a read-only replica",
			"name the master, or its sentinels with redis-sentinel://"}, true
	}
	return problem{}, false
}

// quotedText is a Go-quoted string (%q) in an error's text.
var quotedText = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)

// timedOut reports whether err is a deadline passed or a network timeout.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) ||
		strings.Contains(err.Error(), "context deadline exceeded") || strings.Contains(err.Error(), "i/o timeout")
}

// at is " at ADDRESS" when err names the address it failed on.
func at(err error) string {
	var op *net.OpError
	if errors.As(err, &op) && op.Addr != nil {
		return " at " + op.Addr.String()
	}
	return ""
}
