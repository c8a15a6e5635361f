package test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// transactionProd is the name every transaction moves.
const transactionProd = "prod." + Zone

// transactionSQL is one registry transaction that moves alias prod from
// cluster t<i-1> to t<i>: it inserts t<i>'s two nodes, points prod at
// t<i> and drops t<i-1>, in one of three orders of statements, so that its
// first notification names each of its changes in turn.
func transactionSQL(i int) string {
	a := transactionAddrs(i)
	ins := fmt.Sprintf("INSERT INTO pgcluster_nodes(cluster, name, address) VALUES ('t%d', 'a', '%s'), ('t%d', 'b', '%s')", i, a[0], i, a[1])
	mv := fmt.Sprintf("UPDATE pgcluster_aliases SET target = 't%d' WHERE alias = 'prod'", i)
	del := fmt.Sprintf("DELETE FROM pgcluster_nodes WHERE cluster = 't%d'", i-1)
	orders := [][]string{{mv, ins, del}, {del, mv, ins}, {ins, del, mv}}
	return "BEGIN; " + strings.Join(orders[i%len(orders)], "; ") + "; COMMIT"
}

// transactionAddrs are the addresses of cluster t<i>'s nodes, sorted as
// Addrs sorts them.
func transactionAddrs(i int) []string {
	x := 2 * (i % 120)
	return slices.Sorted(slices.Values([]string{fmt.Sprintf("198.51.100.%d", x+1), fmt.Sprintf("198.51.100.%d", x+2)}))
}

// transactionOf says which transaction an answer for prod shows: i when it
// is the CNAME to t<i> and t<i>'s two addresses, or why it is not whole.
func transactionOf(r *dns.Msg) (int, error) {
	if r.Rcode != dns.RcodeSuccess {
		return 0, fmt.Errorf("%s", dns.RcodeToString[r.Rcode])
	}
	if len(r.Answer) == 0 {
		return 0, fmt.Errorf("no records")
	}
	c, ok := r.Answer[0].(*dns.CNAME)
	var i int
	if !ok || !strings.EqualFold(c.Hdr.Name, transactionProd) {
		return 0, fmt.Errorf("first record %v, want prod's CNAME", r.Answer[0])
	}
	if _, err := fmt.Sscanf(c.Target, "t%d."+Zone, &i); err != nil {
		return 0, fmt.Errorf("CNAME to %s", c.Target)
	}
	if got := Addrs(r); !slices.Equal(got, transactionAddrs(i)) {
		return 0, fmt.Errorf("CNAME to t%d with addresses %v, want %v", i, got, transactionAddrs(i))
	}
	return i, nil
}

// TestRegistryTransaction: a registry transaction is one change on every
// instance. 100 times over, one transaction moves alias prod to a new
// cluster, inserts that cluster's nodes and drops the old cluster, while
// every instance of a fleet (one following PostgreSQL, the others reading
// its copy in Redis) is asked prod's address without pause: no answer is
// NXDOMAIN or shows part of a transaction, and none goes back to an
// earlier one.
func TestRegistryTransaction(t *testing.T) {
	w := newRelayWorld(t, 3)
	ins := w.ins
	w.pg.MustExec(t, fmt.Sprintf(`INSERT INTO pgcluster_nodes(cluster, name, address) VALUES ('t0', 'a', '%s'), ('t0', 'b', '%s');
INSERT INTO pgcluster_aliases VALUES ('prod', 't0')`, transactionAddrs(0)[0], transactionAddrs(0)[1]))
	Eventually(t, 20*time.Second, func() error {
		for _, in := range ins {
			r, err := Exchange("udp", in.Addr(), transactionProd, dns.TypeA)
			if err != nil {
				return err
			}
			if i, err := transactionOf(r); err != nil || i != 0 {
				return fmt.Errorf("%s: t%d, %v", in.Addr(), i, err)
			}
		}
		return nil
	})
	f := w.follower(ins)

	// Each instance is asked without pause, by a client of its own.
	var cur atomic.Int64 // the transaction committed last, or being committed
	seen := make([]atomic.Int64, len(ins))
	var mu sync.Mutex
	var bad []string
	var queries, timeouts atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	stopPolling := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopPolling()
	for j, in := range ins {
		wg.Go(func() {
			c := &dns.Client{Net: "udp", Timeout: time.Second}
			m := new(dns.Msg)
			m.SetQuestion(transactionProd, dns.TypeA)
			for {
				select {
				case <-stop:
					return
				default:
				}
				last := cur.Load()
				r, _, err := c.Exchange(m, in.Addr())
				queries.Add(1)
				if err != nil {
					timeouts.Add(1) // a loaded machine; not an answer
					continue
				}
				i, err := transactionOf(r)
				switch {
				case err == nil && int64(i) < seen[j].Load():
					err = fmt.Errorf("t%d after t%d", i, seen[j].Load())
				case err == nil && (int64(i) < last-1 || int64(i) > cur.Load()):
					err = fmt.Errorf("t%d while transaction %d committed", i, last)
				}
				if err != nil {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("%s (transaction %d): %v", in.Addr(), last, err))
					mu.Unlock()
					continue
				}
				seen[j].Store(int64(i))
			}
		})
	}

	ctx := Ctx(t)
	const transactions = 100
	var all []time.Duration
	for i := 1; i <= transactions; i++ {
		cur.Store(int64(i))
		w.mu.Lock()
		_, err := w.conn.Exec(ctx, transactionSQL(i))
		w.mu.Unlock()
		if err != nil {
			t.Fatalf("transaction %d: %v", i, err)
		}
		committed := time.Now()
		deadline := committed.Add(10 * time.Second)
		for j := range ins {
			for seen[j].Load() < int64(i) {
				if time.Now().After(deadline) {
					mu.Lock()
					n, last := len(bad), slices.Clone(bad[max(len(bad)-5, 0):])
					mu.Unlock()
					t.Fatalf("transaction %d not answered by %s after 10s; answers NXDOMAIN or part of a transaction: %d, the last: %v",
						i, ins[j].Addr(), n, last)
				}
				time.Sleep(time.Millisecond)
			}
		}
		all = append(all, time.Since(committed))
	}
	stopPolling()
	t.Logf("registry transaction: %d transactions (alias moved, cluster inserted, old cluster dropped) on %d instances (follower %s), %d queries (%d timed out): %d answers NXDOMAIN or part of a transaction; COMMIT -> answered by all p50 %v, p90 %v, max %v",
		transactions, len(ins), ins[f].Addr(), queries.Load(), timeouts.Load(), len(bad), percentile(all, 50), percentile(all, 90), percentile(all, 100))
	if len(bad) > 0 {
		t.Errorf("%d answers NXDOMAIN or part of a transaction; the first: %v", len(bad), bad[:min(len(bad), 10)])
	}
}
