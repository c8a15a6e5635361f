package test

import (
	"crypto"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// signingKey writes a key for Zone as dnssec-keygen and coredns-keygen do
// (ECDSA P-256 SHA-256, flags 257: one key signs everything) into dir and
// returns the files' path without .key or .private, as the dnssec plugin's
// key file wants it, and the DS record the parent would publish.
func signingKey(t testing.TB, dir string) (string, *dns.DS) {
	t.Helper()
	k := &dns.DNSKEY{Hdr: dns.RR_Header{Name: Zone, Rrtype: dns.TypeDNSKEY, Class: dns.ClassINET, Ttl: 3600},
		Flags: 257, Protocol: 3, Algorithm: dns.ECDSAP256SHA256}
	priv, err := k.Generate(256)
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(dir, fmt.Sprintf("K%s+%03d+%05d", Zone, k.Algorithm, k.KeyTag()))
	if err := os.WriteFile(base+".key", []byte(k.String()+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(base+".private", []byte(k.PrivateKeyString(priv.(crypto.PrivateKey))), 0o600); err != nil {
		t.Fatal(err)
	}
	return base, k.ToDS(dns.SHA256)
}

// signedCorefile serves Zone signed by the dnssec plugin with the key at
// base, from the registry at dsn.
func signedCorefile(base, dsn string, options ...string) string {
	return fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n dnssec {\n  key file %s\n }\n pgcluster {\n  postgres %s\n  %s\n }\n}\n",
		Zone, PortPlaceholder, base, dsn, strings.Join(options, "\n  "))
}

// startUnbound runs unbound on a free loopback port as a validating
// resolver whose only way out is a stub zone to the instance at
// instAddr, with the zone's DS as its trust anchor. Its root hints name
// 127.0.0.1 alone, so nothing it sends leaves the machine.
func startUnbound(t *testing.T, instAddr string, ds *dns.DS) string {
	t.Helper()
	return runUnbound(t, instAddr, `  module-config: "validator iterator"
  trust-anchor: "`+ds.String()+`"`, func(addr string) error {
		_, err := validated(addr, Zone, dns.TypeSOA)
		return err
	})
}

// runUnbound runs unbound on a free loopback port as a resolver whose only
// way out is a stub zone to the instance at instAddr, with the server
// options given (its modules at least), and returns its address once
// ready says it answers. Its root hints name 127.0.0.1 alone, so nothing
// it sends leaves the machine.
func runUnbound(t *testing.T, instAddr, options string, ready func(addr string) error) string {
	t.Helper()
	bin, err := exec.LookPath("unbound")
	if err != nil {
		t.Fatalf("unbound is needed (Debian package unbound; scripts/setup.sh installs it): %v", err)
	}
	port, err := proc.FreeDNSPort()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "root.hints"), []byte(". 3600000 NS a.root.test.\na.root.test. 3600000 A 127.0.0.1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	host, iport, _ := strings.Cut(instAddr, ":")
	conf := fmt.Sprintf(`server:
  interface: 127.0.0.1
  port: %d
  outgoing-interface: 127.0.0.1
  do-ip6: no
  do-not-query-localhost: no
  username: ""
  chroot: ""
  directory: "%[2]s"
  pidfile: ""
  logfile: ""
  use-syslog: no
  verbosity: 1
  val-log-level: 2
  root-hints: "%[2]s/root.hints"
  qname-minimisation: no
  access-control: 127.0.0.0/8 allow
%[3]s
stub-zone:
  name: "%[4]s"
  stub-addr: %[5]s@%[6]s
remote-control:
  control-enable: no
`, port, dir, options, Zone, host, iport)
	if err := os.WriteFile(filepath.Join(dir, "unbound.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	log := &proc.Buffer{}
	cmd := exec.Command(bin, "-d", "-c", filepath.Join(dir, "unbound.conf"))
	cmd.Stdout, cmd.Stderr = log, log
	p, err := proc.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	t.Cleanup(func() {
		if err := p.Stop(stopTimeout); err != nil {
			t.Errorf("unbound: %v", err)
		}
		if t.Failed() {
			t.Logf("unbound on %s, %s; its log:\n%s", addr, p.State(), log.String())
		}
	})
	Eventually(t, 10*time.Second, func() error {
		if p.Exited() {
			return fmt.Errorf("unbound exited (%s): %s", p.State(), log.String())
		}
		return ready(addr)
	})
	return addr
}

// validated asks the resolver at addr with DO set and returns the reply,
// or an error unless it has the ad flag (unbound validated it).
func validated(addr, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.SetEdns0(1232, true)
	m.AuthenticatedData = true
	c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		return nil, err
	}
	if !r.AuthenticatedData {
		return r, fmt.Errorf("%s %s: %s without ad: not validated", name, dns.TypeToString[qtype], dns.RcodeToString[r.Rcode])
	}
	return r, nil
}

// TestDNSSECValidates signs the zone with CoreDNS's dnssec plugin and asks
// unbound, with the zone's DS as its trust anchor, for every kind of name of
// the README's names table: each answer validates (ad), positive, a CNAME
// chain through aliases into a cluster, NXDOMAIN (which the dnssec
// plugin's black lies make NODATA: an NSEC at the name itself, so no zone
// walking) and NODATA. A failover is then seen through unbound within the
// TTL and 1 s.
func TestDNSSECValidates(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, `INSERT INTO pgcluster_nodes(cluster, name, address, role) VALUES
		('local', 'pg1', '192.0.2.1', 'primary'), ('local', 'pg2', '192.0.2.2', 'standby'), ('local', 'pg3', '2001:db8::3', 'standby');
		INSERT INTO pgcluster_aliases(alias, target) VALUES ('prod', 'local'), ('myapp-db', 'prod')`)
	base, ds := signingKey(t, t.TempDir())
	const ttl = 2
	in := StartFleetInstance(t, signedCorefile(base, pg.DSN(""), "ttl "+strconv.Itoa(ttl),
		"ns ns1."+Zone+" 192.0.2.53", "ns ns2."+Zone+" 192.0.2.54"))
	ub := startUnbound(t, in.Addr(), ds)

	for _, tc := range []struct {
		name  string
		qtype uint16
		want  string // the answer's records' data, in order, " " between
	}{
		{Zone, dns.TypeSOA, "SOA"},
		{Zone, dns.TypeNS, "ns1." + Zone + " ns2." + Zone},
		{Zone, dns.TypeDNSKEY, "DNSKEY"},
		{"ns1." + Zone, dns.TypeA, "192.0.2.53"},
		{"local." + Zone, dns.TypeA, "192.0.2.1 192.0.2.2"},
		{"local." + Zone, dns.TypeTXT, "TXT"},
		{"primary.local." + Zone, dns.TypeA, "192.0.2.1"},
		{"standby.local." + Zone, dns.TypeAAAA, "2001:db8::3"},
		{"replica.local." + Zone, dns.TypeA, "192.0.2.2"},
		{"prefer-standby.local." + Zone, dns.TypeA, "192.0.2.2"},
		{"pg1.local." + Zone, dns.TypeA, "192.0.2.1"},
		{"pg1.local." + Zone, dns.TypeTXT, "TXT"},
		{"_postgresql._tcp.local." + Zone, dns.TypeSRV, "pg1.local." + Zone + " pg2.local." + Zone + " pg3.local." + Zone},
		{"prod." + Zone, dns.TypeA, "local." + Zone + " 192.0.2.1 192.0.2.2"},
		{"myapp-db." + Zone, dns.TypeA, "prod." + Zone + " local." + Zone + " 192.0.2.1 192.0.2.2"},
		{"primary.prod." + Zone, dns.TypeA, "primary.local." + Zone + " 192.0.2.1"},
		// NODATA: a name without the type, an empty non-terminal, a CNAME
		// to a name without the type.
		{"local." + Zone, dns.TypeMX, ""},
		{"_tcp.local." + Zone, dns.TypeSRV, ""},
		{"ns1." + Zone, dns.TypeAAAA, ""},
		{"primary.prod." + Zone, dns.TypeAAAA, "primary.local." + Zone},
		// NXDOMAIN, as the dnssec plugin answers it.
		{"nope." + Zone, dns.TypeA, ""},
		{"nope.local." + Zone, dns.TypeA, ""},
		{"nope.prod." + Zone, dns.TypeA, ""},
	} {
		r, err := validated(ub, tc.name, tc.qtype)
		if err != nil {
			t.Errorf("%v\n%v", err, r)
			continue
		}
		if got := answerData(r); got != tc.want || r.Rcode != dns.RcodeSuccess {
			t.Errorf("%s %s: %s %q, want NOERROR %q\n%v", tc.name, dns.TypeToString[tc.qtype], dns.RcodeToString[r.Rcode], got, tc.want, r)
		}
	}

	// Failover: pg1 leaves, pg2 becomes the primary. Through unbound's
	// cache, the new primary shows within the TTL and 1 s.
	if _, err := validated(ub, "primary.local."+Zone, dns.TypeA); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	pg.MustExec(t, `UPDATE pgcluster_nodes SET healthy = false, role = 'standby' WHERE name = 'pg1';
		UPDATE pgcluster_nodes SET role = 'primary' WHERE name = 'pg2'`)
	bound := ttl*time.Second + time.Second
	var seen time.Duration
	Eventually(t, bound+5*time.Second, func() error {
		r, err := validated(ub, "primary.local."+Zone, dns.TypeA)
		if err != nil {
			return err
		}
		if got := answerData(r); got != "192.0.2.2" {
			return fmt.Errorf("primary.local.%s: %q, want the new primary 192.0.2.2", Zone, got)
		}
		seen = time.Since(changed)
		return nil
	})
	t.Logf("failover seen through unbound, validated, %v after the registry change (TTL %d s)", seen.Round(time.Millisecond), ttl)
	if seen > bound {
		t.Errorf("failover seen after %v, want within TTL + 1 s (%v)", seen, bound)
	}
}

// answerData renders an answer section: the CNAMEs' targets in order,
// then the address, target or name server of each other record, or its
// type (SOA, TXT, DNSKEY), sorted (answers are rotated); RRSIGs left out.
func answerData(r *dns.Msg) string {
	var cnames, out []string
	for _, rr := range r.Answer {
		switch v := rr.(type) {
		case *dns.A:
			out = append(out, v.A.String())
		case *dns.AAAA:
			out = append(out, v.AAAA.String())
		case *dns.CNAME:
			cnames = append(cnames, v.Target)
		case *dns.NS:
			out = append(out, v.Ns)
		case *dns.SRV:
			out = append(out, v.Target)
		case *dns.RRSIG:
		default:
			out = append(out, dns.TypeToString[rr.Header().Rrtype])
		}
	}
	sort.Strings(out)
	return strings.Join(append(cnames, out...), " ")
}
