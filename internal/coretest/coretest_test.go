package coretest

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var build Build

func TestMain(m *testing.M) {
	code := m.Run()
	build.Remove()
	os.Exit(code)
}

// TestFreePorts checks that the ports of an instance differ, and that a
// given DNS port is kept.
func TestFreePorts(t *testing.T) {
	for _, port := range []int{0, 5353} {
		p, err := FreePorts(port, &Claims{})
		if err != nil {
			t.Fatal(err)
		}
		ps := []int{p.DNS, p.Metrics, p.Health, p.Ready}
		if slices.Contains(ps, 0) || len(slices.Compact(slices.Sorted(slices.Values(ps)))) != len(ps) || (port != 0 && p.DNS != port) {
			t.Errorf("FreePorts(%d) = %+v; want four different ports, the DNS one %d when given", port, p, port)
		}
	}
}

// TestFreePortsAtOnce checks that instances given ports at once, as a
// fleet's are, never get the same one: a port is free again once FreePorts
// lets go of it, before the instance binds it, and CoreDNS binds with
// SO_REUSEPORT, so two instances given one port would share it without an
// error (both metrics URLs reaching one instance's metrics).
func TestFreePortsAtOnce(t *testing.T) {
	const n = 30
	claims := &Claims{}
	got := make([]Ports, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { got[i], errs[i] = FreePorts(0, claims) })
	}
	wg.Wait()
	owner := map[int]int{}
	for i, p := range got {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		for _, port := range []int{p.DNS, p.Metrics, p.Health, p.Ready} {
			if j, ok := owner[port]; ok {
				t.Errorf("port %d given to instance %d and to instance %d", port, j, i)
			}
			owner[port] = i
		}
	}
}

// TestWatch checks that output saying a port was taken is noticed, also
// when it comes in two writes, and is passed on whole.
func TestWatch(t *testing.T) {
	for _, split := range []int{0, 10, len("Listen: listen tcp 127.0.0.1:1: bind: address al")} {
		line := "Listen: listen tcp 127.0.0.1:1: bind: address already in use\n"
		var b strings.Builder
		w := &watch{w: &b}
		w.Write([]byte("starting\n" + line[:split]))
		w.Write([]byte(line[split:]))
		if !w.taken() {
			t.Errorf("split at %d: the address already in use was not noticed", split)
		}
		if b.String() != "starting\n"+line {
			t.Errorf("split at %d: passed on %q", split, b.String())
		}
	}
	w := &watch{w: &strings.Builder{}}
	w.Write([]byte("address already"))
	w.Write([]byte(" in the log, not in use\n"))
	if w.taken() {
		t.Error("a line that does not say a port is taken was taken for one")
	}
}

// zoneCorefile serves zone from a file, with metrics, health and ready on
// their placeholders; the zone file is written to dir.
func zoneCorefile(t *testing.T, dir string) string {
	t.Helper()
	db := "$ORIGIN example.test.\n@ 3600 IN SOA ns.example.test. admin.example.test. 1 7200 3600 1209600 3600\n@ 3600 IN NS ns\nns 3600 IN A 192.0.2.1\n"
	if err := os.WriteFile(filepath.Join(dir, "db.example"), []byte(db), 0o644); err != nil {
		t.Fatal(err)
	}
	return "example.test.:{PORT} {\n bind 127.0.0.1\n file db.example\n prometheus 127.0.0.1:{METRICS}\n health 127.0.0.1:{HEALTH}\n ready 127.0.0.1:{READY}\n}\n"
}

// TestStart runs bin/coredns from a Corefile on free ports and checks what
// the tests do with it: it answers the SOA, exposes metrics, answers
// nothing while frozen and again once thawed, and is gone once killed.
func TestStart(t *testing.T) {
	dir := t.TempDir()
	in := Start(t, Config{
		Binary:       build.Binary(t),
		Corefile:     zoneCorefile(t, dir),
		Dir:          dir,
		Ready:        SOA("example.test.", 250*time.Millisecond),
		ReadyTimeout: 30 * time.Second,
	})
	if in.Metrics == 0 || in.Health == 0 || in.Ready == 0 || in.MetricsURL() == "" {
		t.Fatalf("ports %+v, metrics %q: want every port", in.Ports, in.MetricsURL())
	}
	soa := SOA("example.test.", 250*time.Millisecond)
	if err := in.Wait(10*time.Second, func() error {
		v, ok, err := in.Metric(`coredns_dns_requests_total{`)
		if err == nil && !ok {
			err = errors.New("no coredns_dns_requests_total yet")
		}
		if err == nil && v == "0" {
			err = errors.New("coredns_dns_requests_total is 0")
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}

	if err := in.Freeze(); err != nil {
		t.Fatal(err)
	}
	if err := soa(in); err == nil {
		t.Error("a frozen instance answered the SOA")
	}
	if err := in.Thaw(); err != nil {
		t.Fatal(err)
	}
	if err := in.Wait(10*time.Second, func() error { return soa(in) }); err != nil {
		t.Fatalf("thawed: %v", err)
	}

	// What a failed test shows: every line of the log, each after the
	// time it was written.
	stamped := strings.Split(strings.TrimSuffix(in.StampedLog(), "\n"), "\n")
	plain := strings.Split(strings.TrimSuffix(in.Log(), "\n"), "\n")
	if len(stamped) != len(plain) || len(plain) < 2 {
		t.Fatalf("stamped log of %d lines, log of %d:\n%s", len(stamped), len(plain), in.StampedLog())
	}
	for i, l := range stamped {
		if at, rest, _ := strings.Cut(l, " "); !regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{3}$`).MatchString(at) || rest != plain[i] {
			t.Errorf("stamped line %q, want the time and %q", l, plain[i])
		}
	}

	in.Kill()
	if !in.Exited() {
		t.Error("a killed instance has not exited")
	}
	if err := in.Wait(time.Second, func() error { return soa(in) }); !errors.Is(err, ErrExited) {
		t.Errorf("Wait on a killed instance: %v, want ErrExited", err)
	}
}

// TestPlaceholders checks that a port the Corefile has no placeholder for
// is 0, and that a Corefile without a DNS port is refused.
func TestPlaceholders(t *testing.T) {
	dir := t.TempDir()
	corefile := strings.NewReplacer(" prometheus 127.0.0.1:{METRICS}\n", "", " health 127.0.0.1:{HEALTH}\n", "").Replace(zoneCorefile(t, dir))
	in := Start(t, Config{
		Binary:       build.Binary(t),
		Corefile:     corefile,
		Dir:          dir,
		Ready:        SOA("example.test.", 250*time.Millisecond),
		ReadyTimeout: 30 * time.Second,
	})
	if in.Metrics != 0 || in.Health != 0 || in.Ready == 0 || in.MetricsURL() != "" {
		t.Errorf("ports %+v, metrics %q: want only DNS and ready", in.Ports, in.MetricsURL())
	}
	if _, err := StartProcess(Config{Binary: build.Binary(t), Corefile: "example.test.:53 {\n}\n", Dir: dir}); err == nil {
		t.Error("a Corefile without {PORT} was started")
	}
}

// TestLaunchPortTaken checks that an instance whose given DNS port is taken
// ends in ErrExited, once, and is not started on other ports: the port was
// the caller's choice.
func TestLaunchPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	dir := t.TempDir()
	var out strings.Builder
	var mu sync.Mutex
	in, err := Launch(context.Background(), Config{
		Binary:       build.Binary(t),
		Corefile:     zoneCorefile(t, dir),
		Dir:          dir,
		DNSPort:      port,
		Output:       lockedWriter{&mu, &out},
		Ready:        SOA("example.test.", 250*time.Millisecond),
		ReadyTimeout: 30 * time.Second,
	})
	if !errors.Is(err, ErrExited) {
		t.Fatalf("Launch on a taken port: %v, want ErrExited", err)
	}
	if in.DNS != port || !in.out.taken() || in.Log() != "" {
		t.Errorf("DNS port %d (want %d), port taken noticed %v, Log %q (want it in Output)", in.DNS, port, in.out.taken(), in.Log())
	}
	mu.Lock()
	defer mu.Unlock()
	if !strings.Contains(out.String(), strconv.Itoa(port)) {
		t.Errorf("its output does not name port %d:\n%s", port, out.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *strings.Builder
}

func (l lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// A Backend accepts while open, refuses while closed, listens on the same
// address once opened again, and counts what it accepted and when.
func TestBackend(t *testing.T) {
	start := time.Now()
	b := NewBackend(t, "127.0.0.1")
	dial := func() error {
		c, err := net.DialTimeout("tcp", b.Addr(), time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}
	if err := dial(); err != nil {
		t.Fatalf("open backend: %v", err)
	}
	// A connection still in the listen queue when the listener closes is
	// dropped unaccepted: close only once the first one was accepted.
	for first := time.Now().Add(5 * time.Second); b.Accepts() < 1 && time.Now().Before(first); {
		time.Sleep(time.Millisecond)
	}
	b.Toggle(t)
	if !b.Closed() {
		t.Fatal("a toggled backend says it is open")
	}
	if err := dial(); err == nil {
		t.Fatal("closed backend accepted a connection")
	}
	b.Toggle(t)
	if b.Closed() {
		t.Fatal("a backend toggled twice says it is closed")
	}
	if err := dial(); err != nil {
		t.Fatalf("backend opened again: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for b.Accepts() < 2 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if n := b.Accepts(); n != 2 {
		t.Errorf("%d connections counted, want 2", n)
	}
	end := time.Now()
	if got := b.AcceptsIn(start, end); len(got) != 2 || got[1].Before(got[0]) {
		t.Errorf("accepted at %v, want two times in order", got)
	}
	if got := b.AcceptsIn(end, end.Add(time.Hour)); len(got) != 0 {
		t.Errorf("accepted at %v after the last dial, want none", got)
	}
}
