package discovery

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
)

func TestPostgresProbe(t *testing.T) {
	pg := discoverytest.NewPostgres(t)
	for _, reply := range []byte{'N', 'S'} {
		pg.SetReply(reply)
		d, err := PostgresProbe.Probe(t.Context(), pg.Addr)
		if err != nil || d <= 0 {
			t.Errorf("reply %q: %s, %v", reply, d, err)
		}
	}
	pg.SetReply('E')
	if _, err := PostgresProbe.Probe(t.Context(), pg.Addr); err == nil || !strings.Contains(err.Error(), "not PostgreSQL") {
		t.Errorf("reply 'E': %v, want not PostgreSQL", err)
	}
	if pg.Startups() != 0 {
		t.Errorf("the probe sent a startup message")
	}
}

func TestProbeUnreachable(t *testing.T) {
	closed := discoverytest.NewPostgres(t)
	closed.Close() // connection refused
	silent := discoverytest.NewSilent(t)
	for _, p := range []struct {
		name string
		p    Prober
	}{{"tcp", TCPProbe}, {"postgres", PostgresProbe}} {
		if _, err := p.p.Probe(t.Context(), closed.Addr); err == nil {
			t.Errorf("%s probe of a closed port succeeded", p.name)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := PostgresProbe.Probe(ctx, silent.Addr)
	if err == nil || !strings.Contains(err.Error(), "no answer") {
		t.Errorf("postgres probe of a silent node: %v, want no answer", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("probe took %s past its timeout", d)
	}
	// A TCP probe only needs the connection: a silent node passes it.
	if _, err := TCPProbe.Probe(t.Context(), silent.Addr); err != nil {
		t.Errorf("tcp probe of an accepting node: %v", err)
	}
}

func TestParseProbe(t *testing.T) {
	for _, name := range []string{"tcp", "postgres", ""} {
		if _, err := ParseProbe(name); err != nil {
			t.Errorf("ParseProbe(%q): %v", name, err)
		}
	}
	if _, err := ParseProbe("icmp"); err == nil {
		t.Error("ParseProbe(icmp) succeeded")
	}
}

func TestRankOrder(t *testing.T) {
	lat := map[netip.AddrPort]time.Duration{}
	var cands []Candidate
	for i, ms := range []int{30, -1, 10, 20, -1} {
		a := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(1000+i))
		cands = append(cands, Candidate{Addr: a})
		lat[a] = time.Duration(ms) * time.Millisecond
	}
	fake := ProbeFunc(func(_ context.Context, a netip.AddrPort) (time.Duration, error) {
		if lat[a] < 0 {
			return 0, context.DeadlineExceeded
		}
		return lat[a], nil
	})
	r := Rank(t.Context(), fake, time.Second, cands)
	var got []uint16
	for _, p := range r {
		got = append(got, p.Addr.Port())
	}
	want := []uint16{1002, 1003, 1000, 1001, 1004}
	if !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	if len(r.Reachable()) != 3 {
		t.Errorf("%d reachable, want 3", len(r.Reachable()))
	}
	if b, ok := r.Best(); !ok || b.Addr.Port() != 1002 {
		t.Errorf("Best = %v %v", b, ok)
	}
	if _, ok := (Ranking{{Err: context.Canceled}}).Best(); ok {
		t.Error("Best of an unreachable ranking")
	}
}
