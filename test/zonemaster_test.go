package test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// The addresses of the Zonemaster test's network namespace: a root server
// (the hint the resolver starts from, and the parent that delegates the
// zone) and the zone's two name servers, each one bin/coredns. They are
// documentation addresses on the namespace's own loopback.
const (
	zmRoot4, zmRoot6 = "192.0.2.1", "2001:db8::1"
	zmNS14, zmNS16   = "192.0.2.53", "2001:db8::53"
	zmNS24, zmNS26   = "198.51.100.53", "2001:db8:1::53"
)

// zmAllowed are the messages, at WARNING or above, that come from the test
// set-up rather than from the zone: its addresses are documentation ones,
// without reverse zones.
var zmAllowed = map[string]string{
	"NAMESERVER_IP_PRIVATE_NETWORK": "documentation addresses",
	"NAMESERVER_IP_WITHOUT_REVERSE": "no reverse zone inside the namespace",
	"NAMESERVER_IP_PTR_MISSING":     "no reverse zone inside the namespace",
	"NAMESERVER_IP_PTR_MISMATCH":    "no reverse zone inside the namespace",
}

// zmMessage is one line of zonemaster-cli --json-stream.
type zmMessage struct {
	Level    string         `json:"level"`
	Module   string         `json:"module"`
	Testcase string         `json:"testcase"`
	Tag      string         `json:"tag"`
	Message  string         `json:"message"`
	Args     map[string]any `json:"args"`
}

// TestZonemaster runs zonemaster-cli, the test suite registries use to
// accept a delegation, against a fleet of two instances with two ns lines,
// inside a network namespace the test makes (a root server there
// delegates the zone: no query can leave the machine), and fails on any
// ERROR or WARNING but those of the set-up's own addresses (zmAllowed).
// It runs twice: unsigned, and signed by the dnssec plugin with the DS in
// the parent (then Zonemaster's DNSSEC tests must find it signed). The
// report, NOTICE and above, is logged (go test -v) for the closing note.
func TestZonemaster(t *testing.T) {
	zm, err := exec.LookPath("zonemaster-cli")
	if err != nil {
		t.Fatalf("zonemaster-cli is needed (Debian package zonemaster-cli; scripts/setup.sh installs it): %v", err)
	}
	if _, err := exec.LookPath("dig"); err != nil {
		t.Fatalf("dig is needed (Debian package dnsutils): %v", err)
	}
	pg := Registry(t)
	pg.MustExec(t, `INSERT INTO pgcluster_nodes(cluster, name, address, role) VALUES
		('local', 'pg1', '192.0.2.11', 'primary'), ('local', 'pg2', '2001:db8::12', 'standby');
		INSERT INTO pgcluster_aliases(alias, target) VALUES ('prod', 'local')`)
	for _, signed := range []bool{false, true} {
		name := map[bool]string{false: "unsigned", true: "signed"}[signed]
		t.Run(name, func(t *testing.T) { zonemaster(t, zm, pg, signed) })
	}
}

// zonemaster runs zonemaster-cli against two instances (signed by the
// dnssec plugin, the parent holding the DS, when signed) in a network
// namespace of their own, and reports as TestZonemaster says.
func zonemaster(t *testing.T, zm string, pg *pgtest.Postgres, signed bool) {
	n := newNetns(t, zmRoot4+"/32", zmNS14+"/32", zmNS24+"/32", zmRoot6+"/128", zmNS16+"/128", zmNS26+"/128")

	dir := t.TempDir()
	glue := fmt.Sprintf("ns1.%[1]s 3600 IN A %[2]s\nns1.%[1]s 3600 IN AAAA %[3]s\nns2.%[1]s 3600 IN A %[4]s\nns2.%[1]s 3600 IN AAAA %[5]s\n",
		Zone, zmNS14, zmNS16, zmNS24, zmNS26)
	sign := ""
	if signed {
		base, ds := signingKey(t, dir)
		glue += ds.String() + "\n"
		sign = fmt.Sprintf(" dnssec {\n  key file %s\n }\n", base)
	}
	root := fmt.Sprintf(`. 86400 IN SOA a.root-servers.test. hostmaster.root-servers.test. 1 14400 3600 1209600 3600
. 86400 IN NS a.root-servers.test.
a.root-servers.test. 86400 IN A %s
a.root-servers.test. 86400 IN AAAA %s
%[3]s 3600 IN NS ns1.%[3]s
%[3]s 3600 IN NS ns2.%[3]s
%[4]s`, zmRoot4, zmRoot6, Zone, glue)
	if err := os.WriteFile(filepath.Join(dir, "root.zone"), []byte(root), 0o644); err != nil {
		t.Fatal(err)
	}
	hints := fmt.Sprintf(". 3600000 NS a.root-servers.test.\na.root-servers.test. 3600000 A %s\na.root-servers.test. 3600000 AAAA %s\n", zmRoot4, zmRoot6)
	if err := os.WriteFile(filepath.Join(dir, "hints"), []byte(hints), 0o644); err != nil {
		t.Fatal(err)
	}
	n.coreDNS("root server", fmt.Sprintf(".:53 {\n bind %s %s\n file %s\n}\n", zmRoot4, zmRoot6, filepath.Join(dir, "root.zone")),
		"@"+zmRoot4, ".", "SOA")

	// The registry through its Unix socket: the namespace has no route to
	// the host's loopback, but a socket file is reached by its path.
	dsn := fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", pg.Dir, pg.Port)
	fleet := func(v4, v6 string) string {
		return fmt.Sprintf("%s:53 {\n bind %s %s\n%s pgcluster {\n  postgres %s\n  ns ns1.%s %s %s\n  ns ns2.%s %s %s\n }\n}\n",
			Zone, v4, v6, sign, dsn, Zone, zmNS14, zmNS16, Zone, zmNS24, zmNS26)
	}
	n.coreDNS("instance ns1", fleet(zmNS14, zmNS16), "@"+zmNS14, Zone, "SOA")
	n.coreDNS("instance ns2", fleet(zmNS24, zmNS26), "@"+zmNS24, Zone, "SOA")
	alignSerials(t, n, pg)

	start := time.Now()
	cmd := n.command(zm, "--json-stream", "--json-translate", "--level", "NOTICE", "--no-progress",
		"--hints", filepath.Join(dir, "hints"), strings.TrimSuffix(Zone, "."))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("zonemaster-cli: %v\n%s", err, out)
	}
	var report []string
	var bad []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m zmMessage
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("zonemaster-cli output %q: %v", line, err)
		}
		r := fmt.Sprintf("%-8s %-12s %-14s %s: %s", m.Level, m.Module, m.Testcase, m.Tag, m.Message)
		report = append(report, r)
		if signed && (m.Tag == "NOT_SIGNED" || m.Tag == "NEITHER_DNSKEY_NOR_DS") {
			bad = append(bad, r+" (the zone is served signed, its DS in the parent)")
		}
		switch m.Level {
		case "WARNING", "ERROR", "CRITICAL":
			if why, ok := zmAllowed[m.Tag]; ok {
				report[len(report)-1] += "  [allowed: " + why + "]"
			} else {
				bad = append(bad, r)
			}
		}
	}
	sort.Stable(byLevel(report))
	t.Logf("zonemaster-cli %s (%v), NOTICE and above:\n%s", strings.TrimSuffix(Zone, "."), time.Since(start).Round(time.Second), strings.Join(report, "\n"))
	if len(bad) > 0 {
		t.Errorf("zonemaster-cli reports, beyond the set-up's own addresses:\n%s", strings.Join(bad, "\n"))
	}
}

// byLevel sorts report lines from CRITICAL down to NOTICE.
type byLevel []string

func (b byLevel) Len() int      { return len(b) }
func (b byLevel) Swap(i, j int) { b[i], b[j] = b[j], b[i] }
func (b byLevel) Less(i, j int) bool {
	rank := func(s string) int {
		return strings.Index("CRITICAL ERROR    WARNING  NOTICE   ", s[:9])
	}
	return rank(b[i]) < rank(b[j])
}

// alignSerials makes the two instances' SOA serials equal, as Zonemaster
// requires (MULTIPLE_SOA_SERIALS). Without the registry relay, each
// instance's serial is the second it loaded a change, or one more than its
// last serial when that is not behind: two instances started apart differ
// until a change reaches both within one second past both serials. The
// test waits for such a second to begin and makes a change, until the
// serials agree.
func alignSerials(t *testing.T, n *netns, pg *pgtest.Postgres) {
	t.Helper()
	serial := func(addr string) int64 {
		out := strings.Fields(n.run("dig", "+time=1", "+tries=1", "+short", "@"+addr, Zone, "SOA"))
		if len(out) < 3 {
			t.Fatalf("SOA from %s: %v", addr, out)
		}
		v, err := strconv.ParseInt(out[2], 10, 64)
		if err != nil {
			t.Fatalf("SOA from %s: %v", addr, out)
		}
		return v
	}
	for i := 0; ; i++ {
		a, b := serial(zmNS14), serial(zmNS24)
		if a == b {
			t.Logf("serials equal (%d) after %d registry changes", a, i)
			return
		}
		if i == 5 {
			t.Fatalf("the instances' serials still differ after %d changes: %d and %d", i, a, b)
		}
		// Both instances take the clock's second as serial only once it is
		// past both serials; start early in that second.
		next := time.Unix(max(a, b)+1, 0).Add(20 * time.Millisecond)
		if d := time.Until(next); d > 0 {
			if d > 30*time.Second {
				t.Fatalf("serials %d and %d are far ahead of the clock", a, b)
			}
			time.Sleep(d)
		}
		// A real change every time: the subtests share the registry, and
		// an UPDATE to the value already there changes no answer.
		pg.MustExec(t, `UPDATE pgcluster_nodes SET port = port + 1 WHERE name = 'pg2'`)
		Eventually(t, 5*time.Second, func() error {
			if a2, b2 := serial(zmNS14), serial(zmNS24); a2 == a || b2 == b {
				return fmt.Errorf("serials %d and %d: not both changed", a2, b2)
			}
			return nil
		})
	}
}
