package tlstest

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"testing"
)

// An issued certificate verifies for its IP SAN against its CA, not for
// another address nor against another CA; its key matches it; Write puts
// the key in a private file.
func TestIssue(t *testing.T) {
	ca, other := New(t, "test CA"), New(t, "other CA")
	p := ca.MustIssue(t, "127.0.0.1", "db.test")
	pair, err := tls.X509KeyPair(p.CertPEM, p.KeyPEM)
	if err != nil {
		t.Fatalf("the certificate and its key do not match: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	verify := func(c *CA, host string) error {
		_, err := leaf.Verify(x509.VerifyOptions{Roots: c.ClientConfig().RootCAs, DNSName: host})
		return err
	}
	for _, host := range []string{"127.0.0.1", "db.test"} {
		if err := verify(ca, host); err != nil {
			t.Errorf("%s against its own CA: %v", host, err)
		}
	}
	if verify(ca, "127.0.0.2") == nil {
		t.Error("verified for 127.0.0.2, which is not in its SANs")
	}
	if verify(other, "127.0.0.1") == nil {
		t.Error("verified against another CA")
	}
	if b, _ := pem.Decode(ca.PEM); b == nil || b.Type != "CERTIFICATE" {
		t.Errorf("CA PEM: %q", ca.PEM)
	}

	f := ca.MustWrite(t, p)
	st, err := os.Stat(f.Key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v, want 0600", st.Mode().Perm())
	}
	if b, _ := os.ReadFile(f.CA); string(b) != string(ca.PEM) {
		t.Error("ca.crt does not hold the CA")
	}
	if _, err := ca.Issue(); err == nil {
		t.Error("a certificate without hosts was issued")
	}
}
