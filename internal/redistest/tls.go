package redistest

import (
	"crypto/tls"
	"errors"
	"io"
	"strconv"
	"testing"
)

// TLS is what a redis-server started by StartTLSProcess serves with. Make
// the files with internal/tlstest.
type TLS struct {
	// CertFile and KeyFile are the server's certificate and key (PEM).
	CertFile, KeyFile string
	// CAFile is the CA that signs client certificates (tls-ca-cert-file):
	// redis-server wants one even when, as here, clients present none.
	CAFile string
	// Client is how the package's own clients (the readiness PING, Client)
	// reach the server: a configuration that trusts its CA.
	Client *tls.Config
}

// StartTLSProcess starts a redis-server that accepts TLS only, on a free
// port of 127.0.0.1 (tls-port; port 0: no plain TCP), without client
// certificates (tls-auth-clients no) and without persistence, and returns
// once it answers PING over TLS. URL() is then rediss://. Everything else
// is as StartProcess.
func StartTLSProcess(dir string, logw io.Writer, t TLS) (*Server, error) {
	if t.CertFile == "" || t.KeyFile == "" || t.CAFile == "" || t.Client == nil {
		return nil, errors.New("redistest: TLS needs CertFile, KeyFile, CAFile and a Client configuration")
	}
	args := func(port int) ([]string, error) {
		return []string{
			"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--tls-cert-file", t.CertFile, "--tls-key-file", t.KeyFile, "--tls-ca-cert-file", t.CAFile,
			"--tls-auth-clients", "no",
			"--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning",
		}, nil
	}
	return startServerTLS(dir, logw, "redis-server (TLS)", args, t.Client)
}

// StartTLS starts a TLS-only redis-server for the test with
// StartTLSProcess, as Start does a plain one.
func StartTLS(t testing.TB, cfg TLS) *Server {
	t.Helper()
	s, err := StartTLSProcess(t.TempDir(), testLog{t}, cfg)
	if err != nil {
		t.Fatalf("this test needs a real redis-server with TLS and could not start one: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}
