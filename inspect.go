package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/health"
	"github.com/pgcluster/pgcluster/internal/printable"
)

// What a tool that shows the fleet (cmd/pgclusterctl) needs from an
// instance's own code: read the registry, reach the fleet's Redis, and judge
// each node in or out, so that it says what an instance with the same
// options says.

// ReadRegistry reads every row of the registry tables at dsn as an
// instance does: in one repeatable-read transaction, each heartbeat's age
// measured by PostgreSQL's clock. Its errors say what is wrong and what to
// do, as the instances' log lines do, and never contain the password.
func ReadRegistry(ctx context.Context, dsn string) ([]Node, []Alias, []Network, error) {
	conn, err := ConnectRegistry(ctx, dsn)
	if err != nil {
		return nil, nil, nil, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		conn.Close(cctx)
		cancel()
	}()
	ctx, cancel := context.WithTimeout(ctx, loadTimeout)
	defer cancel()
	sh, err := readShape(ctx, conn)
	if err != nil {
		return nil, nil, nil, registryFailed(dsn, err)
	}
	nodes, aliases, nets, err := readRegistry(ctx, conn, nil, sh)
	if err != nil {
		return nil, nil, nil, registryFailed(dsn, err)
	}
	return nodeList(nodes), aliasList(aliases), networkList(nets), nil
}

// ConnectRegistry connects to the registry at dsn as ReadRegistry does, for
// a tool that reads and writes in a transaction of its own. Its errors say
// what is wrong and what to do, and never contain the password.
func ConnectRegistry(ctx context.Context, dsn string) (*pgx.Conn, error) {
	if why := badDSN(dsn); why != "" {
		return nil, fmt.Errorf("the DSN cannot be used: %s", why)
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("the DSN cannot be used: %s", errText(err, dsn))
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	if cfg.RuntimeParams["application_name"] == "" {
		cfg.RuntimeParams["application_name"] = "pgclusterctl"
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, registryFailed(dsn, err)
	}
	return conn, nil
}

// ReadNodes reads every row of pgcluster_nodes in tx as ReadRegistry reads
// them (each heartbeat's age by PostgreSQL's clock), for a tool that
// decides on them and writes in the same transaction. Its errors are
// PostgreSQL's.
func ReadNodes(ctx context.Context, tx pgx.Tx) ([]Node, error) {
	sh, err := readShape(ctx, tx.Conn()) // on tx's connection: inside tx
	if err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, nodesQuery(sh))
	if err != nil {
		return nil, err
	}
	nodes, err := pgx.CollectRows(rows, pgx.RowToStructByName[nodeRow])
	if err != nil {
		return nil, fmt.Errorf("read pgcluster_nodes: %w", err)
	}
	return nodeList(nodes), nil
}

// registryFailed is a failed registry session as ReadRegistry reports it:
// what is wrong and what to do, without the DSN's password.
func registryFailed(dsn string, err error) error {
	p := diagnose(err, dsnUser(dsn))
	return fmt.Errorf("registry %s %s. To fix: %s. Error: %s", redact(dsn), p.what, p.todo, errText(err, dsn))
}

// RegistryName is the registry a DSN names, as the instances' log lines
// show it: host:port/database, never the user or password.
func RegistryName(dsn string) string { return redact(dsn) }

// NewRedisClient returns a client of the Redis a redis option's URL names,
// made as an instance makes it (Sentinel and Cluster URLs, TLS, timeouts),
// without connecting. Its errors never contain the URL's passwords.
func NewRedisClient(rawURL string) (redis.UniversalClient, error) {
	rdb, err := newRedisClient(rawURL)
	if err != nil {
		return nil, fmt.Errorf("the Redis URL cannot be used: %w", err)
	}
	return rdb, nil
}

// DefaultRedisPrefix is the redis_prefix of a fleet that sets none: it
// follows the first zone of its pgcluster block.
func DefaultRedisPrefix(zone string) string { return "pgcluster:" + normalizeZone(zone) + ":" }

// ParseBytes reads a size as the max_lag option does: bytes, or a number
// with kB, MB, GB or TB (powers of 1024).
func ParseBytes(s string) (int64, error) { return parseBytes(s) }

func normalizeZone(zone string) string {
	zone = strings.ToLower(zone)
	if !strings.HasSuffix(zone, ".") {
		zone += "."
	}
	return zone
}

// JudgeOptions are the options of a pgcluster block that decide whether a
// node serves: give the fleet's.
type JudgeOptions struct {
	Zone          string        // the block's first zone: names longer than DNS allows in it are skipped
	StaleAfter    time.Duration // stale_after; 0 is off
	AllowLoopback bool          // allow_loopback
	Check         string        // check: "tcp" or "postgres"; "" is off, and the verdicts are ignored
	MaxLag        int64         // max_lag in bytes; 0 is off
	MaxLagTime    time.Duration // max_lag as a duration (replay_lag as the primary reports it); 0 is off
}

// Judgement is one node judged as an instance with the options judges it.
type Judgement struct {
	Node // the row, its cluster and name in lower case and its role folded, as served
	// RegistryServing is whether the registry alone lets the node serve;
	// RegistryReason is why not (unhealthy, stale, loopback, ...), or
	// "serving".
	RegistryServing bool
	RegistryReason  string
	// Serving, Reason and Detail are the verdict: in or out, the stable
	// word an instance shows in TXT and logs, and what a person reads.
	Serving bool
	Reason  string
	Detail  string
	// Role is the role answered: the one the check reads while it is up,
	// else the registry's; RegistryRole is the registry's, trimmed and in
	// lower case as an instance reads it.
	Role         string
	RegistryRole string
	// Check is the check's verdict (Unknown when not checked yet).
	Check health.Verdict
	// Lag is the bytes the node's replay trails its cluster's primary, as
	// both checks last read them; -1 when unknown. Lagging: over max_lag,
	// out of standby. and prefer-standby.
	Lag     int64
	Lagging bool
	// SyncState and PrimaryLag are a standby's sync_state and replay_lag
	// as its cluster's primary's check read them from pg_stat_replication;
	// "" and 0 when unknown (see sync.).
	SyncState  string
	PrimaryLag time.Duration
	// DrainText says which drain holds the node, as its TXT does; "" when
	// none: it serves (Serving) under its own name alone.
	DrainText string
}

// ClusterJudgement is a cluster's rows judged.
type ClusterJudgement struct {
	Name  string      // the cluster as served: in lower case
	Nodes []Judgement // the rows served, by name
	// Skipped are the rows never served, each with its reason (the
	// rows_skipped metric's) and the row it names.
	Skipped []Skipped
	// Serving and Out count the nodes judged, in and out of the shared
	// names, and Drained those a drain keeps out that would serve;
	// Primaries names the serving nodes that claim to be primary
	// (primary.<cluster> has an address only when there is exactly one).
	Serving, Out, Drained int
	Primaries             []string
}

// Skipped is a row never served: why, and which.
type Skipped struct {
	Reason string // invalid_name, reserved_name, duplicate, name_too_long
	Row    string // node "NAME" in cluster "CLUSTER"
}

// Judge judges every row of nodes with the checks' verdicts view (by
// "cluster/name", as the fleet's statuses are keyed) with an instance's own
// validation and verdicts, as an instance with o does: clusters and their
// nodes in the order of their names.
func Judge(nodes []Node, view health.View, o JudgeOptions) ([]ClusterJudgement, error) {
	zone := normalizeZone(o.Zone)
	if why := badDomain(zone); why != "" {
		return nil, fmt.Errorf("zone %q %s", o.Zone, why)
	}
	if o.Check != "" && o.Check != checkTCP && o.Check != checkPostgres {
		return nil, errors.New("check must be tcp, postgres or empty (off), not " + o.Check)
	}
	set := &settings{zones: []string{zone}, staleAfter: o.StaleAfter, allowLoopback: o.AllowLoopback,
		check: o.Check, maxLag: o.MaxLag, maxLagTime: o.MaxLagTime, allDown: allDownOpen}
	in := buildInput{settings: set, view: view}
	groups := groupNodes(nodes)
	// The row each member was made from: of rows that differ only in
	// case, the one in lower case is served, else the first.
	rows := map[string]Node{}
	for _, n := range nodes {
		key := strings.ToLower(n.Cluster + "/" + n.Name)
		if _, ok := rows[key]; !ok || n.Cluster+"/"+n.Name == key {
			rows[key] = n
		}
	}
	var out []ClusterJudgement
	for _, name := range slices.Sorted(maps.Keys(groups)) {
		cb := &clusterBuild{name: name, rows: groups[name]}
		c := cb.validate(in, set.zoneLen())
		cj := ClusterJudgement{Name: name, Serving: cb.stat.serving, Out: cb.stat.out, Drained: cb.stat.drained, Primaries: cb.stat.primaries}
		for _, sk := range cb.skipped {
			cj.Skipped = append(cj.Skipped, Skipped{Reason: sk.reason, Row: sk.what})
		}
		if c != nil && set.checksOn() && o.MaxLag == 0 && o.MaxLagTime == 0 {
			// Lag is shown without max_lag too: measured the same way,
			// nobody is over a limit that does not exist.
			c.judgeLag(math.MaxInt64)
		}
		for _, m := range memberList(c) {
			j := Judgement{Node: m.Node, RegistryServing: m.registryOK, RegistryReason: reasonServing,
				Serving: m.serving, Reason: m.reason, Detail: m.detail, Role: m.Role, Check: m.check, Lag: -1,
				RegistryRole: printable.Cut(strings.ToLower(strings.TrimSpace(rows[m.Cluster+"/"+m.Name].Role)), maxRole)}
			if !m.registryOK {
				j.RegistryReason = m.reason
			}
			if set.checksOn() { // lag is measured by the checks alone
				j.Lag, j.Lagging = m.lag, m.lagging
			}
			if m.replica != nil {
				j.SyncState, j.PrimaryLag = m.replica.Sync, m.replica.Lag
			}
			if m.Drain.drained() {
				j.DrainText = printable.Cut(drainText(m.Drain), maxTXTString)
			}
			cj.Nodes = append(cj.Nodes, j)
		}
		out = append(out, cj)
	}
	return out, nil
}

func memberList(c *cluster) []*member {
	if c == nil {
		return nil
	}
	return c.members
}
