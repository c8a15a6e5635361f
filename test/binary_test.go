package test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// TestBinary runs the real bin/coredns: it lists dns.pgcluster, serves the
// seed's names from a real registry over UDP and TCP, and stops on SIGTERM.
func TestBinary(t *testing.T) {
	bin := coreDNSBinary(t)
	out, err := exec.Command(bin, "-plugins").Output()
	if err != nil || !strings.Contains(string(out), "dns.pgcluster") {
		t.Fatalf("coredns -plugins: %v\n%s", err, out)
	}

	pg := Registry(t)
	pg.MustExec(t, demoRegistry)
	port, err := proc.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(t.TempDir(), "Corefile")
	corefile := fmt.Sprintf("%s:%d {\n bind 127.0.0.1\n errors\n pgcluster {\n  postgres %s\n }\n}\n", Zone, port, pg.DSN(""))
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	cmd := exec.Command(bin, "-conf", conf)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})

	addr := fmt.Sprintf("127.0.0.1:%d", port)
	for _, proto := range []string{"udp", "tcp"} {
		Eventually(t, 20*time.Second, func() error {
			r, err := Exchange(proto, addr, "myapp-db."+Zone, dns.TypeA)
			if err != nil {
				return err
			}
			if len(r.Answer) != 4 || !r.Authoritative {
				return fmt.Errorf("%s: %v", proto, r.Answer)
			}
			return nil
		})
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		t.Fatalf("coredns did not stop on SIGTERM; log:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "Registry loaded") {
		t.Errorf("the log should say the registry was loaded:\n%s", logs.String())
	}
}
