package discovery

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/discovery/discoverytest"
)

// bigCluster publishes n nodes as cluster "local": 127.1.x.y port 1, where
// nothing listens, so every probe is refused at once.
func bigCluster(t *testing.T, n int) *discoverytest.Server {
	t.Helper()
	s := discoverytest.NewServer(t, zone)
	nodes := make([]discoverytest.Node, n)
	for i := range nodes {
		ip := netip.AddrFrom4([4]byte{127, 1, byte(i >> 8), byte(i)})
		nodes[i] = discoverytest.Node{Name: fmt.Sprintf("n%d", i), Addr: netip.AddrPortFrom(ip, 1)}
	}
	s.SetCluster("local", nodes...)
	return s
}

// maxErrLen is the most bytes an error about a whole cluster may take,
// however big the cluster.
const maxErrLen = 512

// A 3,000-node cluster costs a bounded number of queries and probes and
// gives a short error, whether the server sends the SRV targets' addresses
// and a partial answer without TC over TCP (pgcluster), or no addresses
// and TC over TCP (a server truncating with dns.Msg.Truncate). Queries:
// A and SRV over UDP then TCP (TC), AAAA over UDP; without glue, A and
// AAAA for MaxUnglued targets.
func TestBigClusterBounded(t *testing.T) {
	tests := []struct {
		name       string
		glue       bool
		tcOnTCP    bool
		maxQueries int64
	}{
		{name: "glue, partial TCP answer without TC", glue: true, maxQueries: 5},
		{name: "no glue, TC over TCP", tcOnTCP: true, maxQueries: 5 + 2*MaxUnglued},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := bigCluster(t, 3000)
			s.SetGlue(tc.glue)
			s.SetTCOverTCP(tc.tcOnTCP)
			cl, err := New(Config{Servers: []string{s.Addr}, Prober: TCPProbe, ProbeTimeout: 5 * time.Second, DNSTimeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			res, err := cl.Discover(t.Context(), "local.pgcluster.lan")
			queries := s.Queries()
			t.Logf("%d queries, %d candidates, %d probed, %d not probed, %d unresolved, truncated %v, error %d bytes, %s:\n%v",
				queries, len(res.Candidates), len(res.Ranking), res.NotProbed, res.Unresolved, res.Truncated,
				len(fmt.Sprint(err)), time.Since(start).Round(time.Millisecond), err)
			if !errors.Is(err, ErrUnreachable) {
				t.Fatalf("Discover: %v, want ErrUnreachable (nothing listens)", err)
			}
			if queries > tc.maxQueries {
				t.Errorf("%d DNS queries, want at most %d", queries, tc.maxQueries)
			}
			if len(err.Error()) > maxErrLen {
				t.Errorf("error of %d bytes, want at most %d", len(err.Error()), maxErrLen)
			}
			probed := min(len(res.Candidates), DefaultMaxProbes)
			if len(res.Ranking) != probed || res.NotProbed != len(res.Candidates)-probed {
				t.Errorf("probed %d, not probed %d, of %d candidates; want %d probed", len(res.Ranking), res.NotProbed, len(res.Candidates), probed)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf("all %d ", probed)) {
				t.Errorf("error %q does not count the failures", err)
			}
			if res.Truncated != tc.tcOnTCP {
				t.Errorf("Truncated %v, want %v (TC on the TCP answer)", res.Truncated, tc.tcOnTCP)
			}
			if !tc.glue && (len(res.Candidates) != MaxUnglued || res.Unresolved == 0) {
				t.Errorf("without glue: %d candidates, %d unresolved; want %d and the rest", len(res.Candidates), res.Unresolved, MaxUnglued)
			}
			if tc.glue && len(res.Candidates) < 100 {
				t.Errorf("%d candidates from a TCP answer with glue, want hundreds", len(res.Candidates))
			}
		})
	}
}

// Each query that does not fit the buffer starts one node further along, so
// clients asking in turn see different parts of the cluster.
func TestBigClusterRotates(t *testing.T) {
	s := bigCluster(t, 3000)
	cl, _ := New(Config{Servers: []string{s.Addr}})
	a, err := cl.Resolve(t.Context(), "local.pgcluster.lan")
	if err != nil {
		t.Fatal(err)
	}
	b, err := cl.Resolve(t.Context(), "local.pgcluster.lan")
	if err != nil {
		t.Fatal(err)
	}
	if a.Candidates[0].Addr == b.Candidates[0].Addr {
		t.Errorf("two resolutions start with the same candidate %s", a.Candidates[0].Addr)
	}
}

func TestMaxProbes(t *testing.T) {
	s := bigCluster(t, 50)
	cl, err := New(Config{Servers: []string{s.Addr}, Prober: TCPProbe, MaxProbes: 3})
	if err != nil {
		t.Fatal(err)
	}
	res, err := cl.Discover(t.Context(), "local.pgcluster.lan")
	if !errors.Is(err, ErrUnreachable) || len(res.Ranking) != 3 || res.NotProbed != 47 {
		t.Fatalf("MaxProbes 3: %d probed, %d not, %v", len(res.Ranking), res.NotProbed, err)
	}
	if !strings.Contains(err.Error(), "47 other candidates not probed") {
		t.Errorf("error %q does not say 47 were not probed", err)
	}
	if _, err := New(Config{Servers: []string{s.Addr}, MaxProbes: -1}); err == nil {
		t.Error("MaxProbes -1 accepted")
	}
}

// A query no server answers names every attempt in an error of bounded
// length, however many servers there are.
func TestQueryErrorShort(t *testing.T) {
	e := &QueryError{Name: "local.pgcluster.lan.", Type: 1}
	for i := range 500 {
		e.Errs = append(e.Errs, fmt.Errorf("127.0.0.1:%d: read udp: i/o timeout %s", 1000+i, strings.Repeat("x", 300)))
	}
	msg := e.Error()
	if len(msg) > maxErrLen || !strings.Contains(msg, "all 500 attempts failed") || !strings.Contains(msg, "498 more") {
		t.Errorf("%d bytes: %s", len(msg), msg)
	}
	if !errors.Is(e, e.Errs[499]) {
		t.Error("the last attempt's error is not wrapped")
	}
}
