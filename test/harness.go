// Package test holds pgcluster's integration, fleet and fault tests, and the
// harness that starts what they need: real PostgreSQL servers and real
// CoreDNS servers (in process, or the built bin/coredns) on free ports.
package test

import (
	"context"
	"fmt"
	"net"
	"runtime/pprof"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	_ "github.com/pgcluster/pgcluster/plugin" // the build's plugin bundle
)

// Zone is the zone the tests serve.
const Zone = "pgcluster.lan."

var caddyMu sync.Mutex

// Registry starts a PostgreSQL server with the registry schema applied.
func Registry(t testing.TB) *pgtest.Postgres {
	t.Helper()
	pg := pgtest.New(t)
	pg.MustExec(t, pgcluster.Schema)
	return pg
}

// Server is an in-process CoreDNS server.
type Server struct {
	UDP, TCP string
	inst     *caddy.Instance
}

// StartCoreDNS starts CoreDNS with corefile, in which every server block
// should listen on port 0 (a free port), and stops it when the test ends.
func StartCoreDNS(t testing.TB, corefile string) *Server {
	t.Helper()
	caddyMu.Lock()
	caddy.Quiet = true
	dnsserver.Quiet = true
	inst, err := caddy.Start(caddyInput(corefile))
	caddyMu.Unlock()
	if err != nil {
		t.Fatalf("start CoreDNS: %v\nCorefile:\n%s", err, corefile)
	}
	s := &Server{inst: inst}
	srv := inst.Servers()[0]
	s.UDP, s.TCP = srv.LocalAddr().String(), srv.Addr().String()
	if err := awaitServing(inst); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Bounded: a server that does not stop fails this test instead of
		// hanging the whole run until go test's timeout.
		done := make(chan struct{})
		go func() { s.Stop(); close(done) }()
		select {
		case <-done:
		case <-time.After(stopTimeout):
			// The goroutines say where the stop hangs.
			var b strings.Builder
			pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Errorf("CoreDNS did not stop within %s; goroutines:\n%s", stopTimeout, b.String())
		}
	})
	return s
}

// stopTimeout bounds how long a test waits for its CoreDNS to stop.
const stopTimeout = 15 * time.Second

// Restart replaces the server's Corefile as the reload plugin does: the old
// instance's shutdown callbacks run, the new one starts on the same listeners.
func (s *Server) Restart(corefile string) error {
	caddyMu.Lock()
	defer caddyMu.Unlock()
	inst, err := s.inst.Restart(caddyInput(corefile))
	if err != nil {
		return err
	}
	s.inst = inst
	return awaitServing(inst)
}

// awaitServing waits until every listener of inst has answered a query over
// UDP and over TCP. CoreDNS starts serving in goroutines after Start or
// Restart returns, and a server stopped before its goroutine has begun to
// serve keeps serving forever (its shutdown finds it "not started"): a test
// that reloads again, or stops, right after a start would leave a server of
// an old instance answering on the port, and Stop would never return. Once
// Restart has returned the old instance's servers are closed, so an answer
// comes from the new one.
func awaitServing(inst *caddy.Instance) error {
	for _, srv := range inst.Servers() {
		for _, a := range []struct {
			net  string
			addr net.Addr
		}{{"udp", srv.LocalAddr()}, {"tcp", srv.Addr()}} {
			if a.addr == nil {
				continue
			}
			err := pgtest.WaitFor(10*time.Second, func() error {
				_, err := Exchange(a.net, a.addr.String(), Zone, dns.TypeSOA)
				return err
			})
			if err != nil {
				return fmt.Errorf("CoreDNS does not serve %s on %s: %v", a.net, a.addr, err)
			}
		}
	}
	return nil
}

// Stop stops the server; a second call does nothing.
func (s *Server) Stop() {
	if s.inst != nil {
		s.inst.ShutdownCallbacks()
		s.inst.Stop()
		s.inst.Wait()
		s.inst = nil
	}
}

// Corefile returns a Corefile serving Zone on a free port from the registry
// at dsn, with extra option lines inside the pgcluster block.
func Corefile(dsn string, options ...string) string {
	return fmt.Sprintf("%s:0 {\n  bind 127.0.0.1\n  pgcluster {\n    postgres %s\n    %s\n  }\n}\n",
		Zone, dsn, strings.Join(options, "\n    "))
}

// Exchange sends one query over net ("udp" or "tcp") to addr.
func Exchange(net, addr, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	c := &dns.Client{Net: net, Timeout: 2 * time.Second}
	r, _, err := c.Exchange(m, addr)
	return r, err
}

// MustQuery is Exchange that fails the test on a transport error.
func MustQuery(t testing.TB, net, addr, name string, qtype uint16) *dns.Msg {
	t.Helper()
	r, err := Exchange(net, addr, name, qtype)
	if err != nil {
		t.Fatalf("query %s %s over %s to %s: %v", name, dns.TypeToString[qtype], net, addr, err)
	}
	return r
}

// Eventually polls cond until it returns nil, failing the test with its last
// error after timeout.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	if err := pgtest.WaitFor(timeout, cond); err != nil {
		t.Fatal(err)
	}
}

// Addrs returns the addresses of the A and AAAA records in an answer, sorted.
func Addrs(m *dns.Msg) []string {
	var out []string
	for _, rr := range m.Answer {
		switch r := rr.(type) {
		case *dns.A:
			out = append(out, r.A.String())
		case *dns.AAAA:
			out = append(out, r.AAAA.String())
		}
	}
	sort.Strings(out)
	return out
}

// Ctx is a context for test SQL.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

type caddyInput string

func (c caddyInput) Body() []byte       { return []byte(c) }
func (c caddyInput) Path() string       { return "Corefile" }
func (c caddyInput) ServerType() string { return "dns" }
