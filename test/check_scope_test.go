package test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/redistest"
)

// segmentBackend stands for one PostgreSQL node at its own loopback
// address: it passes each connection on to a real PostgreSQL server,
// counts the connections it accepts by source address, and closes at once
// those from the sources it refuses (a segment of the network that cannot
// reach the node: its probes fail as against a firewall that resets them).
type segmentBackend struct {
	ln      net.Listener
	to      string
	mu      sync.Mutex
	from    map[netip.Addr]int
	refused map[netip.Addr]bool
}

func newSegmentBackend(t *testing.T, host, to string, refused ...string) *segmentBackend {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	b := &segmentBackend{ln: ln, to: to, from: map[netip.Addr]int{}, refused: map[netip.Addr]bool{}}
	for _, r := range refused {
		b.refused[netip.MustParseAddr(r)] = true
	}
	t.Cleanup(func() { ln.Close() })
	go b.serve()
	return b
}

func (b *segmentBackend) port() int { return b.ln.Addr().(*net.TCPAddr).Port }

func (b *segmentBackend) serve() {
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		src := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		b.mu.Lock()
		b.from[src]++
		refuse := b.refused[src]
		b.mu.Unlock()
		if refuse {
			c.Close()
			continue
		}
		go func() {
			defer c.Close()
			up, err := net.DialTimeout("tcp", b.to, 2*time.Second)
			if err != nil {
				return
			}
			defer up.Close()
			go func() { io.Copy(up, c); up.Close() }()
			io.Copy(c, up)
		}()
	}
}

// counts returns the connections accepted so far by source, and resets them.
func (b *segmentBackend) counts() map[netip.Addr]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.from
	b.from = map[netip.Addr]int{}
	return out
}

// TestCheckScopeZone: check_scope zone over two zones of the network, each
// with two probing instances (check postgres, each probing from its own
// loopback source address), and a passive instance in a third zone with
// no probers. Node b1 refuses zone a's sources: it is out for zone a's
// clients and in for zone b's, on every instance, the passive one too;
// each node is probed once per interval per zone that has instances
// (counted at the nodes), never by the passive instance; and zone c's
// clients, whose zone has no prober, are answered with the fleet's other
// verdicts, as _client's TXT says.
func TestCheckScopeZone(t *testing.T) {
	const interval, timeout = time.Second, 800 * time.Millisecond
	reg := Registry(t)
	to := net.JoinHostPort(reg.Host, fmt.Sprint(reg.Port))
	zoneA, zoneB := []string{"127.0.0.21", "127.0.0.22"}, []string{"127.0.0.23", "127.0.0.24"}
	type node struct{ name, zone, addr string }
	nodes := []node{{"a1", "a", "127.0.0.121"}, {"a2", "a", "127.0.0.122"}, {"b1", "b", "127.0.0.123"}, {"b2", "b", "127.0.0.124"}}
	backends := map[string]*segmentBackend{}
	var rows []string
	for _, n := range nodes {
		var refused []string
		if n.name == "b1" {
			refused = zoneA
		}
		b := newSegmentBackend(t, n.addr, to, refused...)
		backends[n.name] = b
		rows = append(rows, fmt.Sprintf("('main', '%s', '%s', %d, 'standby', 'eu', '%s')", n.name, n.addr, b.port(), n.zone))
	}
	reg.MustExec(t, "INSERT INTO pgcluster_nodes(cluster, name, address, port, role, region, zone) VALUES "+strings.Join(rows, ", ")+
		";\nINSERT INTO pgcluster_networks(network, region, zone) VALUES ('10.1.0.0/16', 'eu', 'a'), ('10.2.0.0/16', 'eu', 'b'), ('10.3.0.0/16', 'eu', 'c')")
	rs := redistest.Start(t)
	corefile := func(lines string) string {
		return fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n prometheus 127.0.0.1:%s\n pgcluster {\n  postgres %s\n  redis %s\n  redis_secret %s\n  allow_loopback\n  ttl 1\n  interval %v\n  timeout %v\n  %s\n }\n}\n",
			Zone, PortPlaceholder, MetricsPlaceholder, reg.DSN(""), rs.URL(), relaySecret, interval, timeout, lines)
	}
	const probing = "check postgres \"user=postgres dbname=postgres sslmode=disable\"\n  role_interval off"
	var corefiles []string
	for i, src := range append(slices.Clone(zoneA), zoneB...) {
		zone := "a"
		if i >= len(zoneA) {
			zone = "b"
		}
		corefiles = append(corefiles, corefile(fmt.Sprintf("%s\n  check_scope zone\n  location eu %s\n  probe_source %s", probing, zone, src)))
	}
	corefiles = append(corefiles, corefile("check passive\n  check_scope zone\n  location eu c"))
	// A passive instance of check_scope fleet, which follows the
	// fleet-wide statuses (none here: every prober is a zone's): its
	// _client TXT says whose verdicts it answers with.
	corefiles = append(corefiles, corefile("check passive"))
	started := StartTogether(t, corefiles...)
	ins, passiveFleet := started[:len(started)-1], started[len(started)-1]
	passive := ins[len(ins)-1]
	clientTXT := func(in *Instance) (string, error) {
		r, err := ecsQuery(in.Addr(), "_client."+Zone, dns.TypeTXT, "10.1.7.0/24", "")
		if err != nil {
			return "", err
		}
		if len(r.Answer) != 1 {
			return "", fmt.Errorf("_client: %v", r.Answer)
		}
		return strings.Join(r.Answer[0].(*dns.TXT).Txt, " "), nil
	}
	if txt, err := clientTXT(passiveFleet); err != nil || !strings.Contains(txt, "checks=fleet verdicts=own") {
		t.Errorf("passive instance of check_scope fleet, _client: %q %v, want checks=fleet verdicts=own", txt, err)
	}

	all := []string{"127.0.0.121", "127.0.0.122", "127.0.0.123", "127.0.0.124"}
	withoutB1 := []string{"127.0.0.121", "127.0.0.122", "127.0.0.124"}
	answers := func(subnet string, want []string) func() error {
		return func() error {
			for i, in := range ins {
				r, err := ecsQuery(in.Addr(), "main."+Zone, dns.TypeA, subnet, "")
				if err != nil {
					return fmt.Errorf("instance %d: %w", i, err)
				}
				if got := slices.Sorted(slices.Values(inOrder(r))); !slices.Equal(got, want) {
					return fmt.Errorf("instance %d, client %s: %v, want %v", i, subnet, got, want)
				}
				if s := scopeOf(r); s != 16 {
					return fmt.Errorf("instance %d, client %s: ECS scope %d, want 16 (the network's: the answer is the zone's)", i, subnet, s)
				}
			}
			return nil
		}
	}
	Eventually(t, 20*time.Second, answers("10.1.7.0/24", withoutB1))
	Eventually(t, 10*time.Second, answers("10.2.7.0/24", all))
	// Zone c has no prober: the fleet's other verdicts (b1 is up for
	// zone b, so up for the fleet).
	Eventually(t, 10*time.Second, answers("10.3.7.0/24", all))
	for subnet, want := range map[string]string{"10.1.7.0/24": "checks=zone:eu/a verdicts=own", "10.3.7.0/24": "checks=zone:eu/c verdicts=fleet"} {
		r, err := ecsQuery(passive.Addr(), "_client."+Zone, dns.TypeTXT, subnet, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Answer) != 1 || !strings.Contains(strings.Join(r.Answer[0].(*dns.TXT).Txt, " "), want) {
			t.Errorf("passive instance, _client for %s: %v, want %q in it", subnet, r.Answer, want)
		}
	}

	// Probes counted at the nodes over a window: each node once per
	// interval per zone with instances, none from the passive instance.
	for _, b := range backends {
		b.counts()
	}
	const window = 6 * time.Second
	time.Sleep(window) // a measurement window, not a synchronisation
	intervals := float64(window / interval)
	sources := map[string]bool{}
	for _, s := range append(slices.Clone(zoneA), zoneB...) {
		sources[s] = true
	}
	var errs []error
	for _, n := range nodes {
		byZone := map[string]int{}
		for src, c := range backends[n.name].counts() {
			switch {
			case slices.Contains(zoneA, src.String()):
				byZone["a"] += c
			case slices.Contains(zoneB, src.String()):
				byZone["b"] += c
			default:
				errs = append(errs, fmt.Errorf("node %s: %d connections from %s, no probing instance's source (the passive instance's?)", n.name, c, src))
			}
		}
		t.Logf("node %s: probes per interval: zone a %.2f, zone b %.2f (one prober per zone: 1.00 each)", n.name, float64(byZone["a"])/intervals, float64(byZone["b"])/intervals)
		for _, z := range []string{"a", "b"} {
			if per := float64(byZone[z]) / intervals; per < 0.5 || per > 1.6 {
				errs = append(errs, fmt.Errorf("node %s: %.2f probes per interval from zone %s, want about 1 (one prober per zone)", n.name, per, z))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Error(err)
	}
	// Zone a's instances still answer zone a's clients without b1, and
	// zone b's with it: nothing flipped while counting.
	if err := answers("10.1.7.0/24", withoutB1)(); err != nil {
		t.Error(err)
	}
	if err := answers("10.2.7.0/24", all)(); err != nil {
		t.Error(err)
	}

	// Zone c's network goes: the instances that followed zone c's
	// verdicts for its clients stop following them.
	reg.MustExec(t, "DELETE FROM pgcluster_networks WHERE network = '10.3.0.0/16'")
	Eventually(t, 10*time.Second, func() error {
		for i, in := range ins[:len(ins)-1] {
			_, ok, err := in.Metric(`coredns_pgcluster_segment_verdicts{segment="zone eu/c",zone="` + Zone + `"}`)
			if err != nil || ok {
				return fmt.Errorf("instance %d still follows zone eu/c after its network went (%v)", i, err)
			}
		}
		return nil
	})
	if !strings.Contains(ins[0].Log(), "no network places clients in [zone eu/c] any more") {
		t.Errorf("instance 0's log does not say it stopped following zone eu/c:\n%s", ins[0].Log())
	}

	// Redis stops: the passive instance can neither read the verdicts
	// nor follow the registry; it answers its last ones, says so in
	// _client's TXT and a metric, and reaches no database meanwhile.
	rs.Stop()
	Eventually(t, 15*time.Second, func() error {
		r, err := ecsQuery(passive.Addr(), "_client."+Zone, dns.TypeTXT, "10.1.7.0/24", "")
		if err != nil {
			return err
		}
		if txt := strings.Join(r.Answer[0].(*dns.TXT).Txt, " "); !strings.Contains(txt, "checks=zone:eu/a verdicts=last") {
			return fmt.Errorf("passive instance's _client without Redis: %q", txt)
		}
		v, ok, err := passive.Metric(`coredns_pgcluster_segment_verdicts{segment="zone eu/a",zone="` + Zone + `"}`)
		if err != nil || !ok || v != "2" {
			return fmt.Errorf("segment_verdicts of zone eu/a on the passive instance: %q %v %v, want 2 (the last read)", v, ok, err)
		}
		if txt, err := clientTXT(passiveFleet); err != nil || !strings.Contains(txt, "checks=fleet verdicts=last") {
			return fmt.Errorf("passive instance of check_scope fleet without Redis, _client: %q %v, want checks=fleet verdicts=last", txt, err)
		}
		return nil
	})
	for _, b := range backends {
		b.counts()
	}
	for subnet, want := range map[string][]string{"10.1.7.0/24": withoutB1, "10.2.7.0/24": all, "10.3.7.0/24": all, "": all} {
		r, err := ecsQuery(passive.Addr(), "main."+Zone, dns.TypeA, subnet, "")
		if err != nil {
			t.Fatal(err)
		}
		if got := slices.Sorted(slices.Values(inOrder(r))); !slices.Equal(got, want) {
			t.Errorf("passive instance without Redis, client %s: %v, want its last verdicts' %v", subnet, got, want)
		}
	}
	time.Sleep(3 * interval) // a window for a probe the passive instance must not send
	for _, n := range nodes {
		for src, c := range backends[n.name].counts() {
			if !sources[src.String()] {
				t.Errorf("node %s: %d connections from %s without Redis: the passive instance probed", n.name, c, src)
			}
		}
	}
	log := passive.Log()
	for _, never := range []string{"following PostgreSQL here", "Registry relay: took the registry lease", "checking every backend locally"} {
		if strings.Contains(log, never) {
			t.Errorf("the passive instance's log says %q: it must reach no database", never)
		}
	}
	if !strings.Contains(log, "answering the statuses last read until it does (a passive instance probes nothing)") {
		t.Errorf("the passive instance's log does not say it answers its last verdicts without Redis:\n%s", log)
	}
}
