package pgtest

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// TLS is a server certificate and its private key, in PEM, for a server to
// present (Options.TLS, SetTLS). Make them with internal/tlstest.
type TLS struct {
	CertPEM, KeyPEM []byte
}

// reloadTimeout bounds the wait for a configuration reload to take effect.
const reloadTimeout = 10 * time.Second

// TLS file names, in the server's directory.
const (
	tlsCertFile = "server.crt"
	tlsKeyFile  = "server.key"
)

// configureTLS writes t's files and turns ssl on, for a server not started
// yet; nil does nothing. The lines go to postgresql.auto.conf, read last, so
// that they win over what a standby copied from its primary, SetTLS's
// ALTER SYSTEM lines included.
func (p *Postgres) configureTLS(t *TLS) error {
	if t == nil {
		return nil
	}
	if err := p.writeTLS(*t); err != nil {
		return err
	}
	return appendFile(filepath.Join(p.data(), "postgresql.auto.conf"), fmt.Sprintf("ssl = on\nssl_cert_file = '%s'\nssl_key_file = '%s'\n",
		filepath.Join(p.Dir, tlsCertFile), filepath.Join(p.Dir, tlsKeyFile)))
}

// writeTLS writes the certificate and key where the server's user reads
// them: PostgreSQL refuses a key that others may read.
func (p *Postgres) writeTLS(t TLS) error {
	if _, err := tls.X509KeyPair(t.CertPEM, t.KeyPEM); err != nil {
		return fmt.Errorf("pgtest: TLS certificate and key: %w", err)
	}
	for _, f := range []struct {
		name string
		b    []byte
		mode os.FileMode
	}{{tlsCertFile, t.CertPEM, 0o644}, {tlsKeyFile, t.KeyPEM, 0o600}} {
		name := filepath.Join(p.Dir, f.name)
		tmp := name + ".new"
		if err := os.WriteFile(tmp, f.b, f.mode); err != nil {
			return err
		}
		if err := p.chown(tmp); err != nil {
			return err
		}
		if err := os.Rename(tmp, name); err != nil {
			return err
		}
	}
	return nil
}

// chown gives a file to the server's user when the servers run as postgres.
func (p *Postgres) chown(name string) error {
	if !p.runAsPG {
		return nil
	}
	uid, _ := strconv.Atoi(p.uid.Uid)
	gid, _ := strconv.Atoi(p.uid.Gid)
	return os.Chown(name, uid, gid)
}

// SetTLS makes a running server present t from now on (ssl = on, through
// ALTER SYSTEM and a reload) and returns once a new connection is shown
// t's certificate. Sessions already open keep what they had: end them
// (pg_terminate_backend) to make clients connect again.
func (p *Postgres) SetTLS(ctx context.Context, t TLS) error {
	if err := p.writeTLS(t); err != nil {
		return err
	}
	// One statement each: ALTER SYSTEM refuses to run in a transaction.
	for _, set := range []string{"ssl = on",
		fmt.Sprintf("ssl_cert_file = '%s'", filepath.Join(p.Dir, tlsCertFile)),
		fmt.Sprintf("ssl_key_file = '%s'", filepath.Join(p.Dir, tlsKeyFile))} {
		if err := p.Exec(ctx, "ALTER SYSTEM SET "+set); err != nil {
			return fmt.Errorf("pgtest: turn ssl on: %w", err)
		}
	}
	if err := p.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	want, _ := pem.Decode(t.CertPEM)
	if want == nil {
		return errors.New("pgtest: TLS certificate is not PEM")
	}
	if err := WaitFor(reloadTimeout, func() error { return p.presents(ctx, want.Bytes) }); err != nil {
		return fmt.Errorf("pgtest: the server at %s does not present the new certificate: %w%s", p.DSN(""), err, p.logTail())
	}
	return nil
}

// presents connects over TLS without verifying and checks that the server
// shows the certificate der.
func (p *Postgres) presents(ctx context.Context, der []byte) error {
	cfg, err := pgx.ParseConfig(strings.Replace(p.DSN(""), "sslmode=disable", "sslmode=require", 1))
	if err != nil {
		return err
	}
	cfg.Fallbacks = nil
	cfg.TLSConfig = &tls.Config{
		InsecureSkipVerify: true, // compared by hand below: any other certificate is refused
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, der) {
				return errors.New("the server presents another certificate")
			}
			return nil
		},
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return err
	}
	return conn.Close(cctx)
}

// PrependHBA puts lines at the top of pg_hba.conf (the first line that
// matches a connection decides), reloads the server and returns once new
// connections follow them. Every server already trusts all of loopback
// (see hbaConf): lines put before that, such as
// "host all dns 127.0.0.0/8 scram-sha-256", make a role log in with its
// password.
func (p *Postgres) PrependHBA(ctx context.Context, lines ...string) error {
	name := filepath.Join(p.data(), "pg_hba.conf")
	old, err := os.ReadFile(name)
	if err != nil {
		return err
	}
	b := []byte(strings.Join(lines, "\n") + "\n")
	if err := os.WriteFile(name, append(b, old...), 0o600); err != nil {
		return err
	}
	var bad string
	if err := p.queryRow(ctx, "SELECT coalesce(string_agg(line_number || ': ' || error, '; '), '') FROM pg_hba_file_rules WHERE error IS NOT NULL", &bad); err != nil {
		return err
	}
	if bad != "" {
		if werr := os.WriteFile(name, old, 0o600); werr != nil {
			return werr
		}
		return fmt.Errorf("pgtest: pg_hba.conf refuses the lines %q: %s", lines, bad)
	}
	return p.reload(ctx)
}

// reload makes the server read its configuration files again and returns
// once new sessions run with them (pg_conf_load_time() moved).
func (p *Postgres) reload(ctx context.Context) error {
	var before time.Time
	if err := p.queryRow(ctx, "SELECT pg_conf_load_time()", &before); err != nil {
		return err
	}
	if err := p.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return err
	}
	err := WaitFor(reloadTimeout, func() error {
		var now time.Time
		if err := p.queryRow(ctx, "SELECT pg_conf_load_time()", &now); err != nil {
			return err
		}
		if !now.After(before) {
			return errors.New("the configuration is not reloaded yet")
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pgtest: reload %s: %w%s", p.DSN(""), err, p.logTail())
	}
	return nil
}
