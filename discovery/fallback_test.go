package discovery

import (
	"slices"
	"testing"
)

// Where a pool's new connections go, by the TXT state and the option: the
// cluster's serving nodes only for a primary. pool with the fallback on,
// while the state is held or none, one node per connection (each waits
// there for its node to take writes); the address answer otherwise.
func TestFallbackTargets(t *testing.T) {
	c := newCluster(t, 0, 0, 0) // n1 primary; n2, n3 standbys
	c.dns.SetTTL(3600)
	old, standbys := c.nodes[0], c.nodes[1:]
	c.nodes[0].Role = "standby"
	c.dns.SetCluster("local", standbys...)
	c.dns.HoldPrimary("local", old)
	cl := c.client(t, Config{})
	// lookup returns where the new connections of a pool go: the union of
	// what LookupFunc returns for as many connections as there are nodes,
	// up to the first that finds a connection on its way to each. The
	// pool has room for one connection, so it makes none of its own.
	lookup := func(name string, opts WatchOptions) ([]string, PrimaryState) {
		t.Helper()
		p, err := cl.NewPool(t.Context(), "postgres://app@"+name+"/db?sslmode=disable&pool_max_conns=1", opts)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var got []string
		for i := range c.nodes {
			addrs, err := p.Watcher().LookupFunc()(t.Context(), name)
			if err != nil && i == 0 {
				t.Fatalf("%s: %v", name, err)
			}
			if err != nil {
				break
			}
			for _, a := range addrs {
				if !slices.Contains(got, a) {
					got = append(got, a)
				}
			}
		}
		slices.Sort(got)
		return got, p.Watcher().PrimaryState()
	}
	serving := []string{standbys[0].Addr.String(), standbys[1].Addr.String()}
	slices.Sort(serving)
	held := []string{old.Addr.String()}

	for _, name := range []string{"primary.local.pgcluster.lan", "primary.prod.pgcluster.lan"} {
		got, st := lookup(name, WatchOptions{})
		if !slices.Equal(got, serving) || st.Status != PrimaryHeld || st.Node != "n1" {
			t.Errorf("%s, held: %v, %+v; want the serving nodes %v and held n1", name, got, st, serving)
		}
	}
	if got, st := lookup("primary.local.pgcluster.lan", WatchOptions{ReadWriteFallback: ReadWriteFallbackOff}); !slices.Equal(got, held) || st.Status != PrimaryHeld {
		t.Errorf("fallback off: %v, %+v; want the held address %v, state read", got, st, held)
	}
	if got, st := lookup("local.pgcluster.lan", WatchOptions{}); !slices.Equal(got, serving) || st.Status != PrimaryUnknown {
		t.Errorf("a pool of the cluster: %v, %+v; want its answer, state not read", got, st)
	}

	c.dns.SetStateTXT(false)
	if got, st := lookup("primary.local.pgcluster.lan", WatchOptions{}); !slices.Equal(got, held) || st.Status != PrimaryUnknown {
		t.Errorf("no TXT (an older server): %v, %+v; want the held address %v as today", got, st, held)
	}
	c.dns.SetStateTXT(true)
	c.dns.SetRecords(`primary.local 3600 IN TXT "state=serving" "node=n1"`) // a second record: unreadable
	if got, st := lookup("primary.local.pgcluster.lan", WatchOptions{}); !slices.Equal(got, held) || st.Status != PrimaryUnknown {
		t.Errorf("two states: %v, %+v; want the held address %v as today", got, st, held)
	}
	c.dns.SetRecords()

	c.nodes[1].Role = "primary"
	c.dns.SetCluster("local", c.nodes[1:]...)
	if got, st := lookup("primary.local.pgcluster.lan", WatchOptions{}); !slices.Equal(got, []string{c.nodes[1].Addr.String()}) || st.Status != PrimaryServing {
		t.Errorf("serving: %v, %+v; want the primary alone", got, st)
	}
	c.nodes[2].Role = "primary"
	c.dns.SetCluster("local", c.nodes[1:]...)
	p, err := cl.NewPool(t.Context(), "postgres://app@primary.local.pgcluster.lan/db?sslmode=disable", WatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if got, err := p.Watcher().LookupFunc()(t.Context(), "primary.local.pgcluster.lan"); err == nil || p.Watcher().PrimaryState().Status != PrimarySplitBrain {
		t.Errorf("split brain: %v, %v, %+v; want no address", got, err, p.Watcher().PrimaryState())
	}
}
