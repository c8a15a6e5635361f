package test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// TestReloadKeepsVerdicts reloads the Corefile (SIGUSR1, a changed ttl) of
// a bin/coredns that checks two backends, one of them down, while a client
// asks it for them every millisecond: with its checks shared through
// Redis, with Redis frozen (the new instance's first Redis call waits for
// a timeout), and with local checks only. Not one answer is SERVFAIL and
// none holds the backend that is down: the new instance answers at once
// with the verdicts of the instance it replaces.
func TestReloadKeepsVerdicts(t *testing.T) {
	const interval, timeout = 500 * time.Millisecond, 200 * time.Millisecond
	rs := redistest.Start(t)
	f := newFleet(t, fleetOptions{interval: interval, timeout: timeout, backends: 2})
	f.backends[1].Close()
	up, down := f.backends[0].host, f.backends[1].host
	local := strings.Replace(f.corefile(rs.URL()), " redis "+rs.URL()+"\n", "\n", 1)
	if local == f.corefile(rs.URL()) {
		t.Fatal("the fleet Corefile has no redis line to take out")
	}
	for _, tc := range []struct {
		name     string
		corefile string
		frozen   bool
	}{
		{"redis", f.corefile(rs.URL()), false},
		{"redis frozen", f.corefile(rs.URL()), true},
		{"local checks", local, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := StartFleetInstance(t, tc.corefile)
			Eventually(t, 10*time.Second, answersOf(in, up))
			if tc.frozen {
				if err := rs.Freeze(); err != nil {
					t.Fatal(err)
				}
				defer rs.Thaw()
				Eventually(t, 10*time.Second, metricIs(t, in, modeLocal, 1))
			}
			for _, ttl := range []int{7, 9} {
				stop := make(chan struct{})
				done := askUntil(in, stop, down)
				reloadTTL(t, in, ttl)
				// The window watched: a new instance not checked
				// yet would answer the backend that is down, and the
				// carried verdicts lapse 2.7 s after its start
				// (Redis's call timeout, 4 intervals, the timeout),
				// which came before the reload was complete.
				time.Sleep(3 * time.Second)
				close(stop)
				n, servfail, held := done()
				t.Logf("ttl %d: %d answers across the reload, %d SERVFAIL, %d holding the backend that is down", ttl, n, servfail, held)
				if servfail > 0 || held > 0 {
					t.Errorf("reload to ttl %d: %d SERVFAIL and %d answers holding %s (down) in %d", ttl, servfail, held, down, n)
				}
			}
		})
	}
}

// askUntil asks in for local.<Zone> every millisecond until stop is
// closed; done returns how many answers came, how many were SERVFAIL and
// how many held host.
func askUntil(in *Instance, stop <-chan struct{}, host string) (done func() (n, servfail, held int)) {
	var n, servfail, held int
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			m, err := Exchange("udp", in.Addr(), "local."+Zone, dns.TypeA)
			if err == nil {
				n++
				if m.Rcode == dns.RcodeServerFailure {
					servfail++
				}
				if slices.Contains(Addrs(m), host) {
					held++
				}
			}
			time.Sleep(time.Millisecond)
		}
	})
	return func() (int, int, int) {
		wg.Wait()
		return n, servfail, held
	}
}

// reloadTTL rewrites the instance's Corefile with ttl and sends SIGUSR1,
// then waits until the reload is logged and answers carry the new ttl.
func reloadTTL(t *testing.T, in *Instance, ttl int) {
	t.Helper()
	path, err := confPath(in.Pid())
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	conf := string(b)
	if i := strings.Index(conf, "pgcluster {\n"); i >= 0 && !ttlLine.MatchString(conf) {
		conf = conf[:i] + "pgcluster {\n  ttl 5\n" + conf[i+len("pgcluster {\n"):]
	}
	conf = ttlLine.ReplaceAllString(conf, fmt.Sprintf("${1}%d", ttl))
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	before := strings.Count(in.Log(), "Reloading complete")
	if err := syscall.Kill(in.Pid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 15*time.Second, func() error {
		if strings.Count(in.Log(), "Reloading complete") == before {
			return fmt.Errorf("%s has not logged Reloading complete after SIGUSR1", in.Addr())
		}
		m, err := Exchange("udp", in.Addr(), "local."+Zone, dns.TypeA)
		if err != nil {
			return err
		}
		if len(m.Answer) == 0 || m.Answer[0].Header().Ttl != uint32(ttl) {
			return fmt.Errorf("after the reload to ttl %d, %s answers %v", ttl, in.Addr(), m.Answer)
		}
		return nil
	})
}

// ttlLine is a Corefile's ttl line.
var ttlLine = regexp.MustCompile(`(?m)^(\s*ttl )\d+$`)

// confPath reads the -conf argument of process pid.
func confPath(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "", err
	}
	args := strings.Split(string(b), "\x00")
	if i := slices.Index(args, "-conf"); i >= 0 && i+1 < len(args) {
		return args[i+1], nil
	}
	return "", fmt.Errorf("process %d has no -conf argument: %q", pid, args)
}
