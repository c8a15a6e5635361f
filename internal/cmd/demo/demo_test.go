package main

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
	_ "github.com/pgcluster/pgcluster/plugin" // the build's plugin bundle
)

type corefileInput string

func (c corefileInput) Body() []byte       { return []byte(c) }
func (c corefileInput) Path() string       { return "Corefile" }
func (c corefileInput) ServerType() string { return "dns" }

// TestDemo runs the demo's set-up against a real PostgreSQL and serves its
// Corefile (on free ports) in process: prod must answer with its CNAME and
// the three demo nodes.
func TestDemo(t *testing.T) {
	pg := pgtest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range 2 { // seeding twice is harmless
		if err := seed(ctx, pg.DSN("")); err != nil {
			t.Fatal(err)
		}
	}

	caddy.Quiet, dnsserver.Quiet = true, true
	conf := corefile(corefileConfig{port: 0, ready: "127.0.0.1:0", metrics: "127.0.0.1:0", dsn: pg.DSN("")})
	inst, err := caddy.Start(corefileInput(conf))
	if err != nil {
		t.Fatalf("start CoreDNS: %v\nCorefile:\n%s", err, conf)
	}
	t.Cleanup(func() {
		inst.ShutdownCallbacks()
		inst.Stop()
		inst.Wait()
	})

	r, err := waitAnswer(ctx, inst.Servers()[0].LocalAddr().String(), 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	var target string
	var addrs []string
	for _, rr := range r.Answer {
		switch rr := rr.(type) {
		case *dns.CNAME:
			target = rr.Target
		case *dns.A:
			addrs = append(addrs, rr.A.String())
		}
	}
	slices.Sort(addrs)
	if want := []string{"127.0.0.11", "127.0.0.12", "127.0.0.13"}; target != "local."+zone+"." || !slices.Equal(addrs, want) {
		t.Errorf("prod.%s: CNAME %q, A %v; want CNAME local.%s., A %v", zone, target, addrs, zone, want)
	}
}

func TestCheckFree(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := checkFree(l.Addr().String(), false); err == nil {
		t.Errorf("checkFree(%s), a port in use, = nil; want an error", l.Addr())
	}
}
