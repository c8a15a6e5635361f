// Package tlstest makes what a TLS test needs: a certificate authority of its
// own and server certificates it signs, for loopback addresses, written to
// files a server and a client read. Keys are ECDSA P-256; certificates are
// valid from an hour ago for a day.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// validity is how long a certificate made here is valid, from an hour ago.
const validity = 24 * time.Hour

// CA is a certificate authority made for a test.
type CA struct {
	// Cert is the CA's certificate, PEM its PEM encoding (what a client
	// trusts: sslrootcert, SSL_CERT_FILE, tls-ca-cert-file).
	Cert *x509.Certificate
	PEM  []byte

	key    *ecdsa.PrivateKey
	serial atomic.Int64
}

// Pair is a certificate and its private key, in PEM.
type Pair struct {
	CertPEM, KeyPEM []byte
}

// NewCA makes a self-signed certificate authority named name.
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("tlstest: make CA %q: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{Cert: cert, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: key}
	ca.serial.Store(1)
	return ca, nil
}

// Issue signs a server certificate for hosts: IP addresses go in the IP
// SANs, anything else in the DNS SANs; the first is the common name.
func (ca *CA) Issue(hosts ...string) (Pair, error) {
	if len(hosts) == 0 {
		return Pair{}, fmt.Errorf("tlstest: a certificate needs at least one host")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial.Add(1)), Subject: pkix.Name{CommonName: hosts[0]},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(validity),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, fmt.Errorf("tlstest: issue a certificate for %v: %w", hosts, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	return Pair{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

// ClientConfig returns a client TLS configuration that trusts only ca.
func (ca *CA) ClientConfig() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// Files are the paths a Pair and its CA were written to.
type Files struct {
	CA, Cert, Key string
}

// Write writes ca's certificate, the pair's certificate and its key (mode
// 0600) to ca.crt, server.crt and server.key in dir.
func (ca *CA) Write(dir string, p Pair) (Files, error) {
	f := Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "server.crt"), Key: filepath.Join(dir, "server.key")}
	for _, w := range []struct {
		name string
		b    []byte
		mode os.FileMode
	}{{f.CA, ca.PEM, 0o644}, {f.Cert, p.CertPEM, 0o644}, {f.Key, p.KeyPEM, 0o600}} {
		if err := os.WriteFile(w.name, w.b, w.mode); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

// New makes a CA for the test, failing it on error.
func New(t testing.TB, name string) *CA {
	t.Helper()
	ca, err := NewCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// MustIssue is Issue failing the test on error.
func (ca *CA) MustIssue(t testing.TB, hosts ...string) Pair {
	t.Helper()
	p, err := ca.Issue(hosts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// MustWrite is Write to a new temporary directory of the test, failing it
// on error.
func (ca *CA) MustWrite(t testing.TB, p Pair) Files {
	t.Helper()
	f, err := ca.Write(t.TempDir(), p)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
