package test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/proc"
)

// TestRegistryFrozen stops every process of the PostgreSQL server with
// SIGSTOP: its sockets stay open and the kernel still acknowledges, but
// nothing answers. registry_up drops to 0 within seconds while answers go on
// from the snapshot; after SIGCONT a change shows within seconds.
func TestRegistryFrozen(t *testing.T) {
	pg := Registry(t)
	pg.MustExec(t, demoRegistry)
	metricsPort, _ := proc.FreePort()
	corefile := fmt.Sprintf("%s:0 {\n bind 127.0.0.1\n prometheus 127.0.0.1:%d\n pgcluster {\n  postgres %s\n  refresh 1h\n }\n}\n",
		Zone, metricsPort, pg.DSN(""))
	s := StartCoreDNS(t, corefile)
	up := func(v string) func() error {
		return func() error {
			body, err := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
			if err != nil {
				return err
			}
			if want := `coredns_pgcluster_registry_up{zone="pgcluster.lan."} ` + v; !strings.Contains(body, want) {
				return fmt.Errorf("metrics lack %s", want)
			}
			return nil
		}
	}
	Eventually(t, 10*time.Second, up("1"))

	frozen := freeze(t, pg)
	start := time.Now()
	Eventually(t, 20*time.Second, up("0"))
	detected := time.Since(start)
	t.Logf("frozen registry (%d processes stopped) detected after %v", len(frozen), detected)
	if detected > 8*time.Second {
		t.Errorf("a frozen registry went unnoticed for %v", detected)
	}
	for i := range 20 {
		r := MustQuery(t, "udp", s.UDP, "local."+Zone, dns.TypeA)
		if got := Addrs(r); r.Rcode != dns.RcodeSuccess || len(got) != 2 {
			t.Fatalf("query %d with the registry frozen: rcode %s, %v", i, dns.RcodeToString[r.Rcode], got)
		}
	}

	thaw(frozen)
	pg.MustExec(t, "UPDATE pgcluster_nodes SET address = '192.0.2.41' WHERE name = 'pg1'")
	changed := time.Now()
	Eventually(t, 20*time.Second, func() error { return hasAddr(s, "pg1.local."+Zone, "192.0.2.41") })
	took := time.Since(changed)
	t.Logf("after SIGCONT, a change showed in %v", took)
	if took > 10*time.Second {
		t.Errorf("a change took %v to show after the registry thawed", took)
	}
	Eventually(t, 10*time.Second, up("1"))
}

// freeze stops the postmaster of pg, then every process it started, with
// SIGSTOP, and continues them all when the test ends.
func freeze(t *testing.T, pg *pgtest.Postgres) []int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(pg.Dir, "data", "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	postmaster, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil {
		t.Fatalf("postmaster.pid: %v", err)
	}
	pids := []int{postmaster}
	t.Cleanup(func() { thaw(pids) })
	// Stopped first, the postmaster can start no process after the list is made.
	if err := syscall.Kill(postmaster, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	children, err := childrenOf(postmaster)
	if err != nil {
		t.Fatal(err)
	}
	for _, pid := range children {
		if err := syscall.Kill(pid, syscall.SIGSTOP); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

func thaw(pids []int) {
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGCONT)
	}
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) ([]int, error) {
	stats, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return nil, err
	}
	var out []int
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // gone meanwhile
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(b)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 2 {
			continue
		}
		if ppid, _ := strconv.Atoi(fields[1]); ppid == pid {
			child, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			out = append(out, child)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no processes found under the postmaster %d", pid)
	}
	return out, nil
}
