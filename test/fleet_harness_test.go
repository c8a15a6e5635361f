package test

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"github.com/miekg/dns"
)

// fleetCorefile is a fleet instance's Corefile against the registry at dsn.
func fleetCorefile(dsn string) string {
	return fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n errors\n prometheus 127.0.0.1:%s\n pgcluster {\n  postgres %s\n }\n}\n",
		Zone, PortPlaceholder, MetricsPlaceholder, dsn)
}

// answersDemo checks that the instance serves the demo registry's alias.
func answersDemo(in *Instance) error {
	r, err := Exchange("udp", in.Addr(), "myapp-db."+Zone, dns.TypeA)
	if err != nil {
		return err
	}
	if len(r.Answer) != 4 || !r.Authoritative {
		return fmt.Errorf("myapp-db from %s: %v", in.Addr(), r.Answer)
	}
	return nil
}

// The fleet harness runs separate bin/coredns processes: two instances on
// their own ports answer from one registry and serve metrics; a frozen one
// answers nothing until thawed; a killed one is gone and the other keeps
// answering; SIGTERM stops an instance.
func TestFleetHarness(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, demoRegistry)
	corefile := fleetCorefile(pg.DSN(""))

	a := StartFleetInstance(t, corefile)
	b := StartFleetInstanceNoWait(t, corefile)
	b.WaitReady(t, fleetReadyTimeout)
	if a.Addr() == b.Addr() || a.MetricsURL() == b.MetricsURL() || a.Pid() == b.Pid() {
		t.Fatalf("two instances share an address or a process: %s %s, %s %s, %d %d",
			a.Addr(), b.Addr(), a.MetricsURL(), b.MetricsURL(), a.Pid(), b.Pid())
	}
	for _, in := range []*Instance{a, b} {
		if err := answersDemo(in); err != nil {
			t.Fatal(err)
		}
		body, err := get(in.MetricsURL())
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(body, "coredns_pgcluster_") {
			t.Errorf("%s has no coredns_pgcluster_ metric", in.MetricsURL())
		}
	}

	b.Freeze()
	if _, err := Exchange("udp", b.Addr(), Zone, dns.TypeSOA); err == nil {
		t.Fatal("a frozen instance answered")
	}
	b.Thaw()
	if err := answersDemo(b); err != nil {
		t.Fatalf("a thawed instance: %v", err)
	}

	pid := a.Pid()
	a.Kill()
	if !a.Exited() || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
		t.Fatalf("process %d is still there after Kill", pid)
	}
	if _, err := Exchange("udp", a.Addr(), Zone, dns.TypeSOA); err == nil {
		t.Fatal("a killed instance answered")
	}
	if err := answersDemo(b); err != nil {
		t.Fatalf("the other instance after the kill: %v", err)
	}

	if err := b.Term(); err != nil {
		t.Fatal(err)
	}
	if !b.Exited() || !strings.Contains(b.Log(), "Registry loaded") {
		t.Errorf("after Term: exited %v; the log should say the registry was loaded:\n%s", b.Exited(), b.Log())
	}
}
