package test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// The switchover rig: three PostgreSQL servers in streaming replication,
// each on an address of its own, a registry naming them, a redis-server and
// three bin/coredns instances checking them with check postgres.

// switchoverHosts are the nodes' addresses: one each, so that an A record
// names a node.
var switchoverHosts = [3]string{"127.0.0.151", "127.0.0.152", "127.0.0.153"}

// switchoverTable is where both writers insert; the server that took a row
// names itself in the columns' defaults.
const switchoverTable = `CREATE TABLE switchover_writes(
  id bigserial PRIMARY KEY,
  writer text NOT NULL,
  seq bigint NOT NULL,
  server_addr inet DEFAULT inet_server_addr(),
  server_port int DEFAULT inet_server_port(),
  at timestamptz NOT NULL DEFAULT clock_timestamp())`

// switchoverSettings are node name's settings: a standby told of a new
// primary asks it again within 200 ms rather than PostgreSQL's 5 s, WAL is
// kept long enough for a standby to catch up after a switch, and
// cluster_name is the node's name, which its WAL receiver gives as
// application_name (what pg_stat_replication names a standby by: every
// connection between two loopback addresses comes from 127.0.0.1).
func switchoverSettings(name string) map[string]string {
	return map[string]string{
		"wal_retrieve_retry_interval": "200ms",
		"wal_keep_size":               "256MB",
		"cluster_name":                name,
	}
}

// Bounds of the rig's waits.
const (
	// switchoverSteadyTimeout bounds the wait for the rig to be steady
	// (DNS names the primary, every node serves, both standbys stream).
	switchoverSteadyTimeout = 90 * time.Second
	// switchoverFollowTimeout bounds the wait for a standby told of the new
	// primary to stream from it, before it is rebuilt instead.
	switchoverFollowTimeout = 15 * time.Second
	// switchoverGoneTimeout bounds the wait for a killed server's processes
	// to end.
	switchoverGoneTimeout = 15 * time.Second
	// switchoverQueryTimeout bounds one DNS query of the rig and the pollers.
	switchoverQueryTimeout = 300 * time.Millisecond
)

// switchoverNode is one node of the rig, at a fixed address and port; its
// server is replaced when it is rebuilt as a standby.
type switchoverNode struct {
	name string
	host string
	port int
	pg   *pgtest.Postgres
}

// switchoverRig is what the rounds act on. Only the benchmark's goroutine
// touches it; the writers and the pollers read nothing of it but the
// addresses.
type switchoverRig struct {
	b       *testing.B
	nodes   [3]*switchoverNode
	reg     *pgtest.Postgres
	ins     []*Instance
	primary int // index of the primary of record
}

// startSwitchoverRig starts the servers, the registry, Redis and the fleet,
// and waits until every instance names node 0 the primary and serves all
// three. Everything is stopped when the benchmark ends.
func startSwitchoverRig(b *testing.B, interval string) *switchoverRig {
	b.Helper()
	r := &switchoverRig{b: b}
	b.Cleanup(r.close)
	p0, err := pgtest.Start(pgtest.Options{Host: switchoverHosts[0], Settings: switchoverSettings("pg1")})
	if err != nil {
		b.Fatalf("the switchover rig needs real PostgreSQL servers and could not start one: %v", err)
	}
	r.nodes[0] = &switchoverNode{name: "pg1", host: p0.Host, port: p0.Port, pg: p0}
	p0.MustExec(b, switchoverTable)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := 1; i < 3; i++ {
		wg.Go(func() {
			name := "pg" + strconv.Itoa(i+1)
			pg, err := pgtest.StartStandby(p0, pgtest.Options{Host: switchoverHosts[i], Settings: switchoverSettings(name)})
			if err != nil {
				errs[i] = err
				return
			}
			r.nodes[i] = &switchoverNode{name: name, host: pg.Host, port: pg.Port, pg: pg}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		b.Fatalf("the switchover rig could not make its standbys: %v", err)
	}

	r.reg = Registry(b)
	var rows []string
	for i, n := range r.nodes {
		role := "standby"
		if i == 0 {
			role = "primary"
		}
		rows = append(rows, fmt.Sprintf("('local', '%s', '%s', %d, '%s')", n.name, n.host, n.port, role))
	}
	r.reg.MustExec(b, "INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES "+strings.Join(rows, ", "))

	rs := redistest.Start(b)
	corefile := switchoverCorefile(r.reg.DSN(""), rs.URL(), switchoverSecret(b), interval)
	r.ins = startInstances(b, corefile, 3)
	if err := r.steady(switchoverSteadyTimeout); err != nil {
		b.Fatalf("the switchover rig never settled: %v", err)
	}
	return r
}

// switchoverCorefile is the fleet's Corefile: check postgres at the
// default interval unless one is given (an experiment; one of 1s or less
// gets a timeout of half of it), rise 2, fall 2,
// TTL 1 s, the checks shared through Redis and signed, and metrics (the
// rounds print how many role sessions the fleet holds).
func switchoverCorefile(dsn, redisURL, secret, interval string) string {
	lines := []string{
		fmt.Sprintf("postgres %q", dsn),
		"allow_loopback",
		"ttl 1",
		`check postgres "user=postgres dbname=postgres sslmode=disable"`,
		"rise 2",
		"fall 2",
		"redis " + redisURL,
		"redis_secret " + secret,
	}
	if interval != "" {
		lines = append(lines, "interval "+interval)
		// The default timeout (1s) must stay shorter than the interval.
		if d, err := time.ParseDuration(interval); err == nil && d <= time.Second {
			lines = append(lines, "timeout "+(d/2).String())
		}
	}
	return fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n prometheus 127.0.0.1:%s\n pgcluster {\n  %s\n }\n}\n",
		Zone, PortPlaceholder, MetricsPlaceholder, strings.Join(lines, "\n  "))
}

// switchoverSecret is a fresh redis_secret.
func switchoverSecret(b *testing.B) string {
	var k [24]byte
	if _, err := rand.Read(k[:]); err != nil {
		b.Fatal(err)
	}
	return hex.EncodeToString(k[:])
}

// close stops every node's current server and removes its directory.
func (r *switchoverRig) close() {
	for _, n := range r.nodes {
		if n != nil && n.pg != nil {
			n.pg.Close()
		}
	}
}

// servers returns the instances' DNS addresses, in order.
func (r *switchoverRig) servers() []string {
	var out []string
	for _, in := range r.ins {
		out = append(out, in.Addr())
	}
	return out
}

// nodeOf returns the index of the node at host, -1 for none.
func (r *switchoverRig) nodeOf(host string) int {
	for i, h := range switchoverHosts {
		if h == host {
			return i
		}
	}
	return -1
}

// steady waits until every instance names the primary of record alone in
// primary.local and every node in local, and both standbys stream from the
// primary and have replayed what it had written when the wait began.
func (r *switchoverRig) steady(timeout time.Duration) error {
	p := r.nodes[r.primary]
	want := []string{p.host}
	all := slices.Sorted(slices.Values(switchoverHosts[:]))
	var lsn uint64
	return pgtest.WaitFor(timeout, func() error {
		for _, in := range r.ins {
			for _, q := range []struct {
				name string
				want []string
			}{{"primary.local." + Zone, want}, {"local." + Zone, all}} {
				m, err := switchoverQuery(in.Addr(), q.name)
				if err != nil {
					return fmt.Errorf("%s from %s: %w", q.name, in.Addr(), err)
				}
				if got := Addrs(m); !slices.Equal(got, q.want) {
					return fmt.Errorf("%s from %s: %v, want %v", q.name, in.Addr(), got, q.want)
				}
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if lsn == 0 {
			var err error
			if lsn, err = p.pg.CurrentLSN(ctx); err != nil {
				return err
			}
		}
		for i, n := range r.nodes {
			if i != r.primary {
				if err := r.streams(ctx, n, lsn); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// streams reports whether standby n streams from the primary of record and
// has replayed its WAL up to lsn, as the primary's pg_stat_replication says.
func (r *switchoverRig) streams(ctx context.Context, n *switchoverNode, lsn uint64) error {
	p := r.nodes[r.primary]
	conn, err := pgx.Connect(ctx, p.pg.DSN(""))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var (
		state  string
		replay int64
	)
	err = conn.QueryRow(ctx, `SELECT state, coalesce(pg_wal_lsn_diff(replay_lsn, '0/0'), 0)::bigint
  FROM pg_stat_replication WHERE application_name = $1 ORDER BY backend_start DESC LIMIT 1`, n.name).Scan(&state, &replay)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%s does not stream from the primary %s", n.name, p.name)
	case err != nil:
		return err
	case state != "streaming":
		return fmt.Errorf("%s: replication state %q, not streaming", n.name, state)
	case uint64(replay) < lsn:
		return fmt.Errorf("%s has replayed up to %d, the primary %s is at %d", n.name, replay, p.name, lsn)
	}
	return nil
}

// synchronous has the primary of record wait for both standbys before it
// acknowledges a commit (synchronous_standby_names 'ANY 2' of the nodes'
// names, the application_name each standby streams with), and waits until
// its pg_stat_replication counts both in the quorum. The setting is the
// primary's own (postgresql.auto.conf): a standby promoted later does not
// inherit it, and rebuilding the old primary removes it.
func (r *switchoverRig) synchronous() error {
	p := r.nodes[r.primary]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var names []string
	for _, n := range r.nodes {
		names = append(names, n.name)
	}
	err := p.pg.Exec(ctx, "ALTER SYSTEM SET synchronous_standby_names = 'ANY 2 ("+strings.Join(names, ", ")+")'")
	if err == nil {
		err = p.pg.Exec(ctx, "SELECT pg_reload_conf()")
	}
	if err != nil {
		return err
	}
	return pgtest.WaitFor(15*time.Second, func() error {
		var quorum int
		if err := p.pg.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'quorum'", &quorum); err != nil {
			return err
		}
		if quorum != 2 {
			return fmt.Errorf("%d standbys in %s's synchronous quorum, want 2", quorum, p.name)
		}
		return nil
	})
}

// sessions returns the role sessions the fleet's instances hold
// (coredns_pgcluster_check_sessions, summed; one per node is the design),
// -1 when an instance's metrics cannot be read.
func (r *switchoverRig) sessions() int {
	total := 0
	c := &http.Client{Timeout: 2 * time.Second}
	for _, in := range r.ins {
		resp, err := c.Get(in.MetricsURL())
		if err != nil {
			return -1
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return -1
		}
		for _, line := range strings.Split(string(body), "\n") {
			if rest, ok := strings.CutPrefix(line, "coredns_pgcluster_check_sessions{"); ok {
				_, v, _ := strings.Cut(rest, "} ")
				n, _ := strconv.ParseFloat(v, 64)
				total += int(n)
			}
		}
	}
	return total
}

// awaitSessions waits up to timeout until the fleet holds a role session
// per node, and returns how many it holds.
// It reads the instances' metrics every 100 ms (not WaitFor's 5 ms: each
// read is three scrapes).
func (r *switchoverRig) awaitSessions(timeout time.Duration) int {
	deadline := time.Now().Add(timeout)
	for {
		n := r.sessions()
		if n >= len(r.nodes) || time.Now().After(deadline) {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// switchoverQuery asks addr for name's A records over UDP.
func switchoverQuery(addr, name string) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	c := &dns.Client{Net: "udp", Timeout: switchoverQueryTimeout}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		return nil, err
	}
	if r.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("rcode %s", dns.RcodeToString[r.Rcode])
	}
	return r, nil
}

// pgCtl runs the node's pg_ctl with args, as the postgres user when the
// benchmark runs as root (as pgtest does).
func (n *switchoverNode) pgCtl(args ...string) error {
	bin, err := pgtest.BinDir()
	if err != nil {
		return err
	}
	name := filepath.Join(bin, "pg_ctl")
	args = append([]string{"-D", filepath.Join(n.pg.Dir, "data")}, args...)
	if os.Geteuid() == 0 {
		args = append([]string{"-u", "postgres", "--", name}, args...)
		name = "runuser"
	}
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl %s on %s: %v: %s", strings.Join(args, " "), n.name, err, out)
	}
	return nil
}

// stopFast is pg_ctl stop -m fast: sessions are ended, WAL is sent to the
// standbys, and it returns once the server is down.
func (n *switchoverNode) stopFast() error { return n.pgCtl("-m", "fast", "-w", "-t", "60", "stop") }

// kill sends SIGKILL to the node's postmaster, as a crash, and returns once
// the postmaster and every process it had started have ended (the
// backends end when they see their postmaster gone).
func (n *switchoverNode) kill() error {
	b, err := os.ReadFile(filepath.Join(n.pg.Dir, "data", "postmaster.pid"))
	if err != nil {
		return err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 1 {
		return fmt.Errorf("%s: postmaster.pid starts with %q", n.name, first)
	}
	pids := append(switchoverChildren(pid), pid)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("%s: SIGKILL of the postmaster (pid %d): %w", n.name, pid, err)
	}
	return pgtest.WaitFor(switchoverGoneTimeout, func() error {
		for _, p := range pids {
			if switchoverAlive(p) {
				return fmt.Errorf("%s: process %d of the killed server is still running", n.name, p)
			}
		}
		return nil
	})
}

// switchoverChildren returns the processes whose parent is pid.
func switchoverChildren(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if st, ok := switchoverStat(p); ok && st.ppid == pid {
			out = append(out, p)
		}
	}
	return out
}

// switchoverAlive reports whether pid runs (a zombie does not).
func switchoverAlive(pid int) bool {
	st, ok := switchoverStat(pid)
	return ok && st.state != 'Z' && st.state != 'X'
}

type switchoverProcStat struct {
	state byte
	ppid  int
}

// switchoverStat reads the state and parent of pid from /proc.
func switchoverStat(pid int) (switchoverProcStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return switchoverProcStat{}, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return switchoverProcStat{}, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 || len(f[0]) != 1 {
		return switchoverProcStat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	return switchoverProcStat{state: f[0][0], ppid: ppid}, true
}

// rebuild makes node n a new streaming standby of the primary of record at
// its own address and port, from a fresh base backup: its old server (down)
// and directory are removed first.
func (r *switchoverRig) rebuild(n *switchoverNode) error {
	n.pg.Close()
	pg, err := pgtest.StartStandby(r.nodes[r.primary].pg, pgtest.Options{Host: n.host, Port: n.port, Settings: switchoverSettings(n.name)})
	if err != nil {
		return fmt.Errorf("rebuild %s as a standby: %w", n.name, err)
	}
	n.pg = pg
	return nil
}

// follow tells standby n to stream from the primary of record, and rebuilds
// it when it does not within switchoverFollowTimeout (after a crash it may
// hold WAL the new primary never had). It says which it did.
func (r *switchoverRig) follow(n *switchoverNode) (string, error) {
	p := r.nodes[r.primary]
	ctx, cancel := context.WithTimeout(context.Background(), switchoverFollowTimeout+5*time.Second)
	defer cancel()
	conninfo := fmt.Sprintf("host=%s port=%d user=postgres application_name=%s", p.host, p.port, n.name)
	err := n.pg.Exec(ctx, "ALTER SYSTEM SET primary_conninfo = '"+conninfo+"'")
	if err == nil {
		err = n.pg.Exec(ctx, "SELECT pg_reload_conf()")
	}
	if err == nil {
		var lsn uint64
		if lsn, err = p.pg.CurrentLSN(ctx); err == nil {
			err = pgtest.WaitFor(switchoverFollowTimeout, func() error { return r.streams(ctx, n, lsn) })
		}
	}
	if err == nil {
		return "followed", nil
	}
	why := switchoverLogCause(n.pg)
	if rerr := r.rebuild(n); rerr != nil {
		return "", fmt.Errorf("%w (it did not follow: %v; %s)", rerr, err, why)
	}
	return "rebuilt (" + why + ")", nil
}

// switchoverLogCause returns why a standby's log says it does not stream:
// its last line about a timeline (a fork it cannot follow is logged, not
// fatal), else its last FATAL line.
func switchoverLogCause(pg *pgtest.Postgres) string {
	b, _ := os.ReadFile(filepath.Join(pg.Dir, "log"))
	lines := strings.Split(string(b), "\n")
	for _, mark := range []string{"timeline", "FATAL:  "} {
		for i := len(lines) - 1; i >= 0; i-- {
			if strings.Contains(lines[i], mark) {
				_, msg, _ := strings.Cut(lines[i], ":  ")
				return msg
			}
		}
	}
	return "nothing about it in its log"
}
