package test

import (
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/tlstest"
)

// TestSecurityPostgresTLS: bin/coredns reaches a registry that serves TLS
// with a certificate for 127.0.0.1 signed by a CA the test made, through a
// DSN with sslmode=verify-full and sslrootcert: it answers and follows
// changes, and pg_stat_ssl shows its session encrypted. An instance whose
// sslrootcert is another CA is refused, logs why and answers nothing. And
// when the registry starts presenting a certificate of another CA (an
// impostor on the registry's address), the running instance refuses it,
// logs why, and no change made behind that certificate reaches its answers
// until the genuine certificate is back.
func TestSecurityPostgresTLS(t *testing.T) {
	ctx := Ctx(t)
	ca, rogue := tlstest.New(t, "registry CA"), tlstest.New(t, "impostor CA")
	genuine := ca.MustIssue(t, pgtest.DefaultHost)
	files := ca.MustWrite(t, genuine)
	impostor := rogue.MustIssue(t, pgtest.DefaultHost)
	rogueFiles := rogue.MustWrite(t, impostor)

	pg := pgtest.New(t, pgtest.Options{TLS: &pgtest.TLS{CertPEM: genuine.CertPEM, KeyPEM: genuine.KeyPEM}})
	pg.MustExec(t, pgcluster.Schema)
	pg.MustExec(t, "INSERT INTO pgcluster_nodes(name, address, role) VALUES ('pg1', '127.0.0.11', 'primary')")
	dsn := func(app, root string) string {
		return fmt.Sprintf("postgres://postgres@%s:%d/postgres?sslmode=verify-full&sslrootcert=%s&application_name=%s",
			pgtest.DefaultHost, pg.Port, root, app)
	}

	in := StartFleetInstance(t, securityCorefile(dsn("pgcluster-tls", files.CA)))
	Eventually(t, 10*time.Second, answersOf(in, "127.0.0.11"))
	pg.MustExec(t, "INSERT INTO pgcluster_nodes(name, address, role) VALUES ('pg2', '127.0.0.12', 'standby')")
	Eventually(t, 10*time.Second, answersOf(in, "127.0.0.11", "127.0.0.12"))

	var (
		n       int
		ssl     bool
		version string
	)
	err := pgQueryRow(ctx, pg, `SELECT count(*) OVER (), s.ssl, coalesce(s.version, '')
FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = 'pgcluster-tls'`, &n, &ssl, &version)
	if err != nil || n != 1 || !ssl {
		t.Fatalf("pg_stat_ssl of the instance's session: %d sessions, ssl %v, %v; want one, encrypted", n, ssl, err)
	}
	t.Logf("the instance's registry session: ssl %v, %s", ssl, version)

	// Another CA in sslrootcert: refused, said so, nothing served.
	wrong := StartFleetInstanceNoWait(t, securityCorefile(dsn("pgcluster-wrong-ca", rogueFiles.CA)))
	line := waitLogged(t, wrong, 20*time.Second, "Registry", "certificate signed by unknown authority")
	t.Logf("wrong CA: %s", line)
	// It listens once its 5 s wait for a first load is over.
	Eventually(t, 20*time.Second, func() error {
		if rc, err := soaRcode(wrong); err != nil || rc != dns.RcodeServerFailure {
			return fmt.Errorf("an instance that refused the registry's certificate answers the SOA with %s, %v; want SERVFAIL", dns.RcodeToString[rc], err)
		}
		return nil
	})
	if metric(t, wrong, registryUp) != 0 {
		t.Fatal("registry_up is not 0 for an instance that refused the registry's certificate")
	}

	// The registry's address now presents the impostor's certificate: the
	// running instance, cut off, refuses it and keeps its answers.
	if err := pg.SetTLS(ctx, pgtest.TLS{CertPEM: impostor.CertPEM, KeyPEM: impostor.KeyPEM}); err != nil {
		t.Fatal(err)
	}
	pg.MustExec(t, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'pgcluster-tls'")
	Eventually(t, 10*time.Second, metricIs(t, in, registryUp, 0))
	line = waitLogged(t, in, 10*time.Second, "Registry", "certificate signed by unknown authority")
	t.Logf("impostor certificate: %s", line)
	pg.MustExec(t, "INSERT INTO pgcluster_nodes(name, address, role) VALUES ('pg3', '127.0.0.13', 'standby')")
	// Longer than the reconnect backoff's first five steps (3.1 s).
	holdsFor(t, 4*time.Second, "behind the impostor's certificate", func() error {
		if err := answersOf(in, "127.0.0.11", "127.0.0.12")(); err != nil {
			return err
		}
		return metricIs(t, in, registryUp, 0)()
	})

	// The genuine certificate back: the instance connects and catches up.
	if err := pg.SetTLS(ctx, pgtest.TLS{CertPEM: genuine.CertPEM, KeyPEM: genuine.KeyPEM}); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 15*time.Second, answersOf(in, "127.0.0.11", "127.0.0.12", "127.0.0.13"))
	Eventually(t, 5*time.Second, metricIs(t, in, registryUp, 1))
}
