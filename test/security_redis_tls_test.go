package test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/redistest"
	"github.com/pgcluster/pgcluster/internal/tlstest"
)

// TestSecurityRedisTLS: a fleet shares its checks through a redis-server
// that accepts TLS only (tls-port, port 0), with a certificate for
// 127.0.0.1 from a CA the test makes, through redis rediss://: two
// instances coordinate and a flip reaches both. pgcluster has no option
// naming a CA for rediss://: the instances trust the test's CA through
// SSL_CERT_FILE, Go's system bundle. A redis:// URL to the TLS port, and a
// rediss:// instance that does not trust the CA, never coordinate: they
// check every backend themselves (local mode) and say why.
func TestSecurityRedisTLS(t *testing.T) {
	const interval, timeout = 200 * time.Millisecond, 100 * time.Millisecond
	ca := tlstest.New(t, "redis CA")
	files := ca.MustWrite(t, ca.MustIssue(t, "127.0.0.1"))
	rs := redistest.StartTLS(t, redistest.TLS{CertFile: files.Cert, KeyFile: files.Key, CAFile: files.CA, Client: ca.ClientConfig()})
	f := newFleet(t, fleetOptions{interval: interval, timeout: timeout, backends: 2})

	t.Setenv("SSL_CERT_FILE", files.CA) // the instances' trusted CAs
	ins := startInstances(t, f.corefile(rs.URL()), 2)
	Eventually(t, 20*time.Second, coordinated(t, ins, len(f.backends)))
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts()))
	f.dropTimes(t, ins, 0, true)
	f.dropTimes(t, ins, 0, false)
	t.Logf("over rediss://%s: two instances coordinated, a flip reached both", rs.Addr())

	// redis:// to the TLS port: no Redis there for a plain client.
	plain := StartFleetInstance(t, f.corefile("redis://"+rs.Addr()))
	// rediss:// trusting another CA only: the certificate is refused.
	other := tlstest.New(t, "other CA")
	otherCA := filepath.Join(t.TempDir(), "other-ca.crt")
	if err := os.WriteFile(otherCA, other.PEM, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SSL_CERT_FILE", otherCA)
	untrusting := StartFleetInstance(t, f.corefile(rs.URL()))
	for _, in := range []*Instance{plain, untrusting} {
		Eventually(t, 10*time.Second, metricIs(t, in, modeLocal, 1))
		Eventually(t, 10*time.Second, answersOf(in, f.hosts()...))
	}
	line := waitLogged(t, untrusting, 10*time.Second, "Redis", "certificate signed by unknown authority")
	t.Logf("rediss:// without the CA: %s", line)
	holdsFor(t, 3*time.Second, "instances that cannot speak TLS to Redis", func() error {
		for _, in := range []*Instance{plain, untrusting} {
			if err := metricIs(t, in, modeLocal, 1)(); err != nil {
				return err
			}
		}
		// The fleet's own two keep their leases: the others took none.
		return coordinated(t, ins, len(f.backends))()
	})
	t.Logf("redis:// to the TLS port: %s", waitLogged(t, plain, 10*time.Second, "Redis"))
}
