package test

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/coretest"
)

// TestBinary runs the real bin/coredns: it lists dns.pgcluster, serves the
// seed's names from a real registry over UDP and TCP, and stops on SIGTERM.
func TestBinary(t *testing.T) {
	bin := coreDNSBuild.Binary(t)
	out, err := exec.Command(bin, "-plugins").Output()
	if err != nil || !strings.Contains(string(out), "dns.pgcluster") {
		t.Fatalf("coredns -plugins: %v\n%s", err, out)
	}

	pg := Registry(t)
	pg.MustExec(t, demoRegistry)
	corefile := fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n errors\n pgcluster {\n  postgres %s\n }\n}\n", Zone, PortPlaceholder, pg.DSN(""))
	in := coretest.StartNoWait(t, coretest.Config{Binary: bin, Corefile: corefile, StopTimeout: 15 * time.Second})

	for _, proto := range []string{"udp", "tcp"} {
		Eventually(t, 20*time.Second, func() error {
			r, err := Exchange(proto, in.Addr(), "myapp-db."+Zone, dns.TypeA)
			if err != nil {
				return err
			}
			if len(r.Answer) != 4 || !r.Authoritative {
				return fmt.Errorf("%s: %v", proto, r.Answer)
			}
			return nil
		})
	}

	// Stop sends SIGTERM and kills the instance, with an error, when it
	// has not stopped within 15 s.
	if err := in.Stop(); err != nil {
		t.Fatalf("coredns did not stop on SIGTERM: %v; log:\n%s", err, in.Log())
	}
	if !strings.Contains(in.Log(), "Registry loaded") {
		t.Errorf("the log should say the registry was loaded:\n%s", in.Log())
	}
}
