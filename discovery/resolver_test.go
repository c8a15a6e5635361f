package discovery

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
)

func TestParseServer(t *testing.T) {
	tests := []struct {
		in, want string
		err      bool
	}{
		{in: "127.0.0.1", want: "127.0.0.1:53"},
		{in: "127.0.0.1:1053", want: "127.0.0.1:1053"},
		{in: " 127.0.0.1:1053 ", want: "127.0.0.1:1053"},
		{in: "::1", want: "[::1]:53"},
		{in: "[::1]", want: "[::1]:53"},
		{in: "[::1]:5353", want: "[::1]:5353"},
		{in: "dns.example", want: "dns.example:53"},
		{in: "fe80::1%eth0", want: "[fe80::1%eth0]:53"},
		{in: "", err: true},
		{in: " ", err: true},
		{in: ":53", err: true},
		{in: ":abc", err: true},
		{in: "127.0.0.1:99999", err: true},
		{in: "127.0.0.1:0", err: true},
		{in: "127.0.0.1:abc", err: true},
		{in: "127.0.0.1:", err: true},
		{in: "a:b:c", err: true},
	}
	for _, tc := range tests {
		got, err := ParseServer(tc.in)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("ParseServer(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestResolverFailsOver(t *testing.T) {
	good := discoverytest.NewServer(t, zone)
	down := discoverytest.NewServer(t, zone)
	down.Stop() // connection refused
	silent := discoverytest.NewServer(t, zone)
	silent.SetSilent(true) // timeouts

	r, err := NewResolver([]string{down.Addr, silent.Addr, good.Addr}, 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Query(t.Context(), zone, dns.TypeSOA)
	if err != nil {
		t.Fatalf("Query: %v", err)
	}
	if len(m.Answer) != 1 {
		t.Fatalf("answer %v, want the SOA", m.Answer)
	}
	// The server that answered is asked first from now on.
	before := silent.Queries()
	if _, err := r.Query(t.Context(), zone, dns.TypeSOA); err != nil {
		t.Fatal(err)
	}
	if silent.Queries() != before {
		t.Errorf("the silent server was asked again after the good one answered")
	}
}

func TestResolverAllDown(t *testing.T) {
	silent := discoverytest.NewServer(t, zone)
	silent.SetSilent(true)
	r, err := NewResolver([]string{silent.Addr}, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := r.Query(t.Context(), zone, dns.TypeSOA); err == nil {
		t.Fatal("Query succeeded with no server answering")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("gave up after %s; want about %d × 100ms", d, DefaultDNSAttempts)
	}
}

func TestResolverRetriesTruncatedOverTCP(t *testing.T) {
	s := discoverytest.NewServer(t, zone)
	s.SetTruncate(true)
	r, err := NewResolver([]string{s.Addr}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m, err := r.Query(t.Context(), zone, dns.TypeSOA)
	if err != nil {
		t.Fatal(err)
	}
	if m.Truncated || len(m.Answer) != 1 {
		t.Fatalf("got truncated=%v answer=%v; want the full answer over TCP", m.Truncated, m.Answer)
	}
}

func TestResolverRefusedIsNoAnswer(t *testing.T) {
	good := discoverytest.NewServer(t, zone)
	r, err := NewResolver([]string{good.Addr}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// Out of the zone, the test server refuses: an error, not an answer.
	if _, err := r.Query(t.Context(), "example.org.", dns.TypeA); err == nil {
		t.Fatal("REFUSED was taken as an answer")
	}
}

func TestSystemResolver(t *testing.T) {
	s := discoverytest.NewServer(t, zone)
	host, _, _ := splitHostPort(s.Addr)
	conf := filepath.Join(t.TempDir(), "resolv.conf")
	body := "nameserver " + host + "\noptions timeout:1 attempts:1\n"
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	// resolv.conf has no port: only a server on 53 could be read from it.
	r, err := SystemResolver(conf, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Servers(); len(got) != 1 || got[0] != host+":53" {
		t.Fatalf("servers %v, want [%s:53]", got, host)
	}
	if r.timeout != time.Second || r.attempts != 1 {
		t.Errorf("timeout %s attempts %d, want 1s and 1", r.timeout, r.attempts)
	}

	if _, err := SystemResolver(filepath.Join(t.TempDir(), "missing"), 0); err == nil {
		t.Error("SystemResolver succeeded without a file")
	}
	empty := filepath.Join(t.TempDir(), "empty.conf")
	os.WriteFile(empty, []byte("search lan\n"), 0o600)
	if _, err := SystemResolver(empty, 0); err == nil {
		t.Error("SystemResolver succeeded without a nameserver")
	}
}

func TestResolverHonoursContext(t *testing.T) {
	silent := discoverytest.NewServer(t, zone)
	silent.SetSilent(true)
	r, _ := NewResolver([]string{silent.Addr}, 10*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := r.Query(ctx, zone, dns.TypeSOA); err == nil {
		t.Fatal("Query succeeded")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Query took %s after its context ended", d)
	}
}
