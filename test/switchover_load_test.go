package test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/discovery"
)

// What runs through the switchover rounds: two writers and a DNS poller
// per instance, each recording every attempt with its times, and the
// record of which node was the primary when.

// Pace of the load.
const (
	// switchoverTick is how often a writer commits an INSERT and a poller
	// asks an instance for primary.local.
	switchoverTick = 10 * time.Millisecond
	// switchoverWriteTimeout bounds one INSERT, connection included.
	switchoverWriteTimeout = 2 * time.Second
)

// switchoverAttempt is one INSERT: when it started and ended, the node
// that acknowledged it (-1 when it failed), and the writer's number of the
// attempt (the row's seq).
type switchoverAttempt struct {
	start, end time.Time
	node       int
	seq        int64
	err        string
}

func (a switchoverAttempt) ok() bool { return a.node >= 0 }

// switchoverWriter commits an INSERT every switchoverTick, one at a time,
// and records each attempt.
type switchoverWriter struct {
	name   string
	insert func(ctx context.Context, seq int64) (host string, err error)

	mu       sync.Mutex
	attempts []switchoverAttempt
}

// switchoverInsert is both writers' statement: the writer and its
// attempt's number (what tells whether an acknowledged write survived the
// switch), and the row's defaults name the server that took it.
const switchoverInsert = "INSERT INTO switchover_writes(writer, seq) VALUES ($1, $2) RETURNING host(server_addr), server_port"

// newSwitchoverWriters makes the two writers' pools: (a) a discovery.Pool
// following primary.local through the fleet's instances, (b) a pgxpool on
// libpq's multi-host string over the three nodes with
// target_session_attrs=read-write. Both are closed when the benchmark ends.
func newSwitchoverWriters(b *testing.B, r *switchoverRig) []*switchoverWriter {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cl, err := discovery.New(discovery.Config{Servers: r.servers(), DNSTimeout: 500 * time.Millisecond})
	if err != nil {
		b.Fatal(err)
	}
	url := "postgres://postgres@primary.local." + strings.TrimSuffix(Zone, ".") +
		"/postgres?sslmode=disable&connect_timeout=2&pool_max_conns=2&application_name=switchover-pgcluster"
	dp, err := cl.NewPool(ctx, url, discovery.WatchOptions{})
	if err != nil {
		b.Fatalf("discovery pool on primary.local: %v", err)
	}
	b.Cleanup(dp.Close)

	var hosts, ports []string
	for _, n := range r.nodes {
		hosts = append(hosts, n.host)
		ports = append(ports, strconv.Itoa(n.port))
	}
	dsn := fmt.Sprintf("host=%s port=%s user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write "+
		"connect_timeout=2 pool_max_conns=2 application_name=switchover-multihost", strings.Join(hosts, ","), strings.Join(ports, ","))
	mp, err := pgxpool.New(ctx, dsn)
	if err != nil {
		b.Fatalf("multi-host pool: %v", err)
	}
	b.Cleanup(mp.Close)

	return []*switchoverWriter{
		{name: "pgcluster", insert: func(ctx context.Context, seq int64) (string, error) {
			var host string
			var port int
			err := dp.QueryRow(ctx, switchoverInsert, "pgcluster", seq).Scan(&host, &port)
			return host, err
		}},
		{name: "multi-host", insert: func(ctx context.Context, seq int64) (string, error) {
			var host string
			var port int
			err := mp.QueryRow(ctx, switchoverInsert, "multi-host", seq).Scan(&host, &port)
			return host, err
		}},
	}
}

// run commits until stop is closed; nodeOf names the node of a host.
func (w *switchoverWriter) run(stop <-chan struct{}, nodeOf func(string) int) {
	tick := time.NewTicker(switchoverTick)
	defer tick.Stop()
	for seq := int64(1); ; seq++ {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		a := switchoverAttempt{start: time.Now(), node: -1, seq: seq}
		ctx, cancel := context.WithTimeout(context.Background(), switchoverWriteTimeout)
		host, err := w.insert(ctx, seq)
		cancel()
		a.end = time.Now()
		switch {
		case err != nil:
			a.err = err.Error()
			if pe, ok := errors.AsType[*pgconn.PgError](err); ok {
				a.err = "SQLSTATE " + pe.Code + ": " + pe.Message
			}
		case nodeOf(host) < 0:
			a.err = "acknowledged by " + host + ", not a node of the rig"
		default:
			a.node = nodeOf(host)
		}
		w.mu.Lock()
		w.attempts = append(w.attempts, a)
		w.mu.Unlock()
	}
}

// since returns the attempts that started at or after from.
func (w *switchoverWriter) since(from time.Time) []switchoverAttempt {
	w.mu.Lock()
	defer w.mu.Unlock()
	i, _ := slices.BinarySearchFunc(w.attempts, from, func(a switchoverAttempt, t time.Time) int { return a.start.Compare(t) })
	return slices.Clone(w.attempts[i:])
}

// all returns every attempt so far.
func (w *switchoverWriter) all() []switchoverAttempt { return w.since(time.Time{}) }

// ackedOn reports whether the writer has an acknowledgement from node that
// ended after from.
func (w *switchoverWriter) ackedOn(node int, from time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := len(w.attempts) - 1; i >= 0 && w.attempts[i].end.After(from); i-- {
		if w.attempts[i].node == node {
			return true
		}
	}
	return false
}

// switchoverAnswer is one answer of an instance for primary.local: the
// nodes it named (a bit per node; switchoverStranger for an address of no
// node), whether it had no address (NODATA) or failed.
type switchoverAnswer struct {
	sent, recv time.Time
	nodes      uint8
	nodata     bool
	failed     bool
}

// switchoverStranger marks an address that is no node's.
const switchoverStranger = 1 << 7

// names reports whether the answer names node i.
func (a switchoverAnswer) names(i int) bool { return a.nodes&(1<<i) != 0 }

// switchoverPoller asks one instance for primary.local's A records every
// switchoverTick, over UDP to its loopback address.
type switchoverPoller struct {
	addr string

	mu      sync.Mutex
	answers []switchoverAnswer
}

func (p *switchoverPoller) run(stop <-chan struct{}, nodeOf func(string) int) {
	tick := time.NewTicker(switchoverTick)
	defer tick.Stop()
	c := &dns.Client{Net: "udp", Timeout: switchoverQueryTimeout}
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		m := new(dns.Msg)
		m.SetQuestion("primary.local."+Zone, dns.TypeA)
		a := switchoverAnswer{sent: time.Now()}
		r, _, err := c.Exchange(m, p.addr)
		a.recv = time.Now()
		switch {
		case err != nil || r.Rcode != dns.RcodeSuccess:
			a.failed = true
		default:
			for _, h := range Addrs(r) {
				if i := nodeOf(h); i >= 0 {
					a.nodes |= 1 << i
				} else {
					a.nodes |= switchoverStranger
				}
			}
			a.nodata = a.nodes == 0
		}
		p.mu.Lock()
		p.answers = append(p.answers, a)
		p.mu.Unlock()
	}
}

// between returns the answers sent in [from, to).
func (p *switchoverPoller) between(from, to time.Time) []switchoverAnswer {
	p.mu.Lock()
	defer p.mu.Unlock()
	i, _ := slices.BinarySearchFunc(p.answers, from, func(a switchoverAnswer, t time.Time) int { return a.sent.Compare(t) })
	j, _ := slices.BinarySearchFunc(p.answers, to, func(a switchoverAnswer, t time.Time) int { return a.sent.Compare(t) })
	return slices.Clone(p.answers[i:max(i, j)])
}

// switchoverRecord is the record of which node was the primary when: a
// node is the primary of record from the moment its promotion is ordered
// until it has stopped (pg_ctl stop returned, or every process of a killed
// server ended), or until another's promotion is ordered while it still
// runs (split brain). Two overlap during a planned switchover, between the
// promotion's order and the stop's end.
type switchoverRecord struct {
	mu      sync.Mutex
	tenures []switchoverTenure
}

type switchoverTenure struct {
	node     int
	from, to time.Time // to is zero while it lasts
}

func (r *switchoverRecord) begin(node int, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tenures = append(r.tenures, switchoverTenure{node: node, from: at})
}

func (r *switchoverRecord) end(node int, at time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.tenures {
		if t := &r.tenures[i]; t.node == node && t.to.IsZero() {
			t.to = at
		}
	}
}

// during reports whether node was the primary of record at some moment of
// [from, to].
func (r *switchoverRecord) during(node int, from, to time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, t := range r.tenures {
		if t.node == node && !t.from.After(to) && (t.to.IsZero() || !t.to.Before(from)) {
			return true
		}
	}
	return false
}
