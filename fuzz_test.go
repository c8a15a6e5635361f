package pgcluster

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/health"
)

// FuzzBuild feeds arbitrary registry rows to the snapshot builder and asks
// the handler about them: nothing may panic, every CNAME must lead to a name
// that exists, and every answer must pack.
func FuzzBuild(f *testing.F) {
	f.Add("local", "pg1", "primary", "prod", "local", "myapp-db", "prod", uint8(1), uint8(1), []byte{192, 0, 2, 1}, int64(0), []byte{})
	f.Add("Local", "primary", "standby", "a", "a", "b", "nowhere", uint8(0), uint8(3), []byte{}, int64(-1), []byte{0x15, 0x2a})
	f.Add("x", "_bad", "unknown", "x", "y", "y", "x", uint8(255), uint8(0), []byte{255, 255, 255, 255}, int64(1<<62), []byte{0xff})
	f.Add(strings.Repeat("c", 63), strings.Repeat("n", 63), "Primary ", "a", "b", "b", strings.Repeat("c", 63), uint8(7), uint8(40), []byte{0xfe, 0x80, 15: 1}, int64(-1<<63), []byte{1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Fuzz(func(t *testing.T, cluster, name, role, a1, t1, a2, t2 string, last, primaries uint8, addr []byte, age int64, checks []byte) {
		a, ok := netip.AddrFromSlice(addr)
		if !ok {
			a = netip.AddrFrom4([4]byte{192, 0, 2, last})
		}
		nodes := []Node{
			{Cluster: cluster, Name: name, Role: role, Address: a, Port: 5432, Healthy: true, HeartbeatAge: time.Duration(age)},
			{Cluster: cluster, Name: name + "2", Role: "standby", Address: netip.AddrFrom4([4]byte{127, 0, 0, last}), Port: 5432, Healthy: true},
		}
		// Split brain: many nodes claim to be primary.
		for i := range int(primaries % 40) {
			nodes = append(nodes, Node{Cluster: cluster, Name: fmt.Sprintf("%.55s%d", name, i), Role: "primary", Address: netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), Port: 5432, Healthy: true})
		}
		// The first alias fails over to the second's target or name (any
		// bytes), and has moved to the second's target.
		aliases := []Alias{{Alias: a1, Target: t1, Fallback: t2 + "," + a2 + "," + cluster, Moved: t2, Why: name},
			{Alias: a2, Target: t2}}
		// Drains: the low bits of the last byte of addr drain the first
		// nodes, with a2 (any bytes) as the reason and t2 as who.
		var drains byte
		if len(addr) > 0 {
			drains = addr[len(addr)-1]
		}
		for i := range nodes {
			if i < 3 && drains&(1<<i) != 0 {
				nodes[i].Drain = Drain{ID: int64(i) + 1, Reason: a2, By: t2, Until: age}
			}
		}
		// Checks: byte i judges node i (state, role, WAL) when present.
		set := &settings{zones: []string{testZone}, ttl: 5, staleAfter: 10 * time.Second, allDown: allDownOpen}
		var view health.View
		if len(checks) > 0 {
			set.check, set.maxLag = checkPostgres, 64
			if checks[0]&0x80 != 0 {
				set.allDown = allDownClosed
			}
			verdicts := map[string]health.Verdict{}
			for i, b := range checks {
				if i >= len(nodes) {
					break
				}
				n := nodes[i]
				verdicts[strings.ToLower(n.Cluster)+"/"+strings.ToLower(n.Name)] = health.Verdict{
					State: health.State(b % 3), Role: []string{"", health.RolePrimary, health.RoleStandby}[b/3%3],
					WAL: uint64(b) * 50, Cause: "refused",
				}
			}
			view = health.ViewOf(verdicts)
		}
		s := build(buildInput{settings: set, nodes: nodes, aliases: aliases, view: view})
		all := owners(s)
		for owner, o := range all {
			if !strings.HasSuffix(owner, testZone) {
				t.Fatalf("owner %q outside the zone", owner)
			}
			if len(owner)+1 > 255 {
				t.Fatalf("owner %q is longer than 255 octets", owner)
			}
			if o.alias != nil && s.parts[o.alias.target] == nil {
				t.Fatalf("alias name %q leads nowhere: %v", owner, o.alias.target)
			}
		}
		// A drained node's address is in no shared name unless a node
		// not drained has it too: only under the own names of the nodes
		// that have it.
		for _, n := range nodes {
			if !n.Drain.drained() {
				continue
			}
			shared := false
			own := map[string]bool{}
			for _, o := range nodes {
				if o.Address.Unmap() == n.Address.Unmap() {
					shared = shared || !o.Drain.drained()
					own[strings.ToLower(o.Name)] = true
				}
			}
			if shared {
				continue
			}
			for owner, o := range all {
				if first, _, _ := strings.Cut(owner, "."); o.e == nil || own[first] {
					continue
				}
				for _, a := range o.e.a {
					if netip.AddrFrom4(a) == n.Address.Unmap() {
						t.Fatalf("%s answers drained node %s's address %s", owner, n.Name, n.Address)
					}
				}
			}
		}
		p := &PgCluster{Zones: []string{testZone}, ttl: 5, Next: test.ErrorHandler()}
		s.setSerial(1, 5)
		p.pb = publisherOf(s)
		for owner := range all {
			for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeTXT, dns.TypeCNAME, dns.TypeNS, dns.TypeSOA, dns.TypeANY} {
				m := new(dns.Msg)
				m.SetQuestion(owner, qt)
				rec := dnstest.NewRecorder(&test.ResponseWriter{})
				if rcode, _ := p.ServeDNS(context.Background(), rec, m); rcode == dns.RcodeServerFailure || rec.Msg.Rcode == dns.RcodeServerFailure {
					t.Fatalf("%s %d: SERVFAIL for a name the zone holds", owner, qt)
				}
				if _, err := rec.Msg.Pack(); err != nil {
					t.Fatalf("%s %d: answer does not pack: %v", owner, qt, err)
				}
			}
		}
	})
}

// FuzzIncremental drives a registry through random changes, each applied to
// the last snapshot as the publisher does (only what changed: a cluster's
// rows, the aliases, the checks' verdicts; now and then a full read), and
// checks after each one that the snapshot is the one a build from nothing
// makes of the same rows: the same names and records, the same sums.
func FuzzIncremental(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{0x81, 0x10, 0x20, 0x30, 0x41, 0x52, 0x63, 0x74, 0x85, 0x96, 0xa7, 0xb8, 0xc9, 0xda, 0xeb, 0xfc})
	f.Add([]byte{0x43, 7, 7, 7, 0x2b, 0x2b, 0x11, 0x19, 0x55, 0x66, 0x77, 0x80, 0x90, 0xa0, 0x03, 0x13, 0x23, 0x33})
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) == 0 {
			return
		}
		set := &settings{zones: []string{testZone}, ttl: 5, allDown: allDownOpen, allowLoopback: ops[0]&0x40 != 0}
		if ops[0]&1 != 0 {
			set.check, set.maxLag = checkPostgres, 64
		}
		if ops[0]&2 != 0 {
			set.staleAfter = 10 * time.Second
		}
		if ops[0]&4 != 0 {
			set.zones = []string{testZone, "b.lan."}
		}
		if ops[0]&8 != 0 {
			set.allDown = allDownClosed
		}
		// The registry's rows, by served cluster, and the aliases, by alias.
		clusters := []string{"c0", "c1", "C1", "c2", "ns", "a0", "b_d"}
		rows := map[string]map[string]Node{}
		aliases := map[string]Alias{}
		view := health.View{}
		cur := emptySnapshot(set)
		// Each change builds the snapshot whole once more to compare: past
		// maxFuzzOps changes, an input costs seconds (a call of more than
		// 10 s is a crash to Go's fuzzing) and finds nothing new.
		for i := 1; i+1 < len(ops) && i/2 < maxFuzzOps; i += 2 {
			op, arg := ops[i], ops[i+1]
			cluster := clusters[int(arg)%len(clusters)]
			name := fmt.Sprintf("n%d", arg/8%4)
			served := strings.ToLower(cluster)
			ch := change{}
			switch op % 6 {
			case 0, 1: // a node inserted or updated
				roles := []string{"primary", "standby", "unknown", " Primary"}
				a := netip.AddrFrom4([4]byte{192, 0, 2, op})
				if op&0x20 != 0 {
					a = netip.AddrFrom4([4]byte{127, 0, 0, op})
				}
				n := Node{Cluster: cluster, Name: name, Address: a, Port: 5432 + int(op>>6), Role: roles[int(op/6)%4], Healthy: op&0x10 == 0,
					HeartbeatAge: time.Duration(int(arg%3)-1) * 11 * time.Second}
				if rows[served] == nil {
					rows[served] = map[string]Node{}
				}
				rows[served][cluster+"/"+name] = n
				ch.nodes = map[string][]Node{served: clusterNodes(rows[served])}
			case 2: // a node deleted
				delete(rows[served], cluster+"/"+name)
				ch.nodes = map[string][]Node{served: clusterNodes(rows[served])}
			case 3: // an alias set or deleted
				alias := fmt.Sprintf("a%d", op/6%3)
				targets := []string{"c0", "c1", "a0", "a1", "a2", "nowhere", "ns", "C2."}
				if arg&0x80 != 0 {
					delete(aliases, alias)
				} else {
					aliases[alias] = Alias{Alias: alias, Target: targets[int(arg)%len(targets)]}
				}
				ch.aliases, ch.aliasesSet = aliasValues(aliases), true
			case 4: // a verdict of the checks
				key := served + "/" + name
				// A new probe time alone builds nothing again: TXT's checked=
				// is as of the cluster's last build (README), so it is fixed here.
				v := health.Verdict{State: health.State(arg % 3), Role: []string{"", health.RolePrimary, health.RoleStandby}[op/6%3],
					WAL: uint64(arg/3%4) * 50, Cause: "refused", Last: time.Unix(1e9, 0)}
				e := view.Edit()
				if arg&0x80 != 0 {
					e.Delete(key)
				} else {
					e.Set(key, v)
				}
				view = e.View()
				ch.view, ch.viewSet = view, true
			case 5: // a full read
				ch.nodes, ch.full = map[string][]Node{}, true
				for c, ns := range rows {
					if len(ns) > 0 {
						ch.nodes[c] = clusterNodes(ns)
					}
				}
				ch.aliases, ch.aliasesSet = aliasValues(aliases), true
			}
			cur = cur.next(ch)
			var all []Node
			for _, ns := range rows {
				all = append(all, clusterNodes(ns)...)
			}
			want := build(buildInput{settings: set, nodes: all, aliases: aliasValues(aliases), view: view})
			if got, want := dump(cur), dump(want); got != want {
				t.Fatalf("after op %d (%d %d), the snapshot built by changes differs from one built whole:\n%s", i/2, op, arg, diffLines(got, want))
			}
		}
	})
}

// maxFuzzOps bounds the changes of one FuzzIncremental input: 1,136 (an
// input of 2,273 bytes, seed 07407c6530c7d673) took 2 s alone, and past
// 10 s on a loaded machine.
const maxFuzzOps = 128

// clusterNodes are a cluster's rows in the registry's order.
func clusterNodes(rows map[string]Node) []Node {
	out := slices.Collect(maps.Values(rows))
	sortNodes(out)
	return out
}

func aliasValues(as map[string]Alias) []Alias {
	out := []Alias{}
	for _, k := range slices.Sorted(maps.Keys(as)) {
		out = append(out, as[k])
	}
	return out
}

// dump is everything a snapshot holds, its serial aside, as text.
func dump(s *snapshot) string {
	var sb strings.Builder
	sb.WriteString(fingerprint(s))
	fmt.Fprintf(&sb, "hash %x failOpen %d split %d skips %v\n", s.hash, s.failOpen, s.split, s.skips)
	fmt.Fprintf(&sb, "targets %v\nskipped %v\n", s.targets, allSkipped(s))
	for _, name := range slices.Sorted(maps.Keys(s.clusters)) {
		cb := s.clusters[name]
		fmt.Fprintf(&sb, "cluster %s served %t longest %d stat %v verdicts %v\n", name, cb.served(), cb.longest, cb.stat, cb.verdicts)
	}
	fmt.Fprintf(&sb, "aliases %v\n", s.aliases.resolved)
	return sb.String()
}

// diffLines shows the lines of got and want that differ.
func diffLines(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	var sb strings.Builder
	for i := range max(len(g), len(w)) {
		var a, b string
		if i < len(g) {
			a = g[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if a != b {
			fmt.Fprintf(&sb, "got:  %s\nwant: %s\n", a, b)
		}
	}
	return sb.String()
}
