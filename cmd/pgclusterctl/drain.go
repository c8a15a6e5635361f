package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/rediserr"
)

// Bounds of drain's flags.
const (
	maxReason = 200         // the longest reason pgcluster_drains takes, in characters
	minPeriod = time.Second // the shortest -for
)

// drainOptions are drain's command line.
type drainOptions struct {
	fleetOptions
	cluster      string
	node         string
	topologyZone string
	reason       string
	// period is -for: how long the drain lasts; 0 until it is deleted.
	period time.Duration
	force  bool
	json   bool
}

func parseDrain(args []string, stderr io.Writer) (drainOptions, error) {
	var o drainOptions
	fs := flag.NewFlagSet("pgclusterctl drain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.flags(fs, "the guards count the nodes the fleet's checks let serve, and the primary as its check reads it")
	fs.StringVar(&o.cluster, "cluster", "", "the `cluster` to drain, or to drain nodes of (required)")
	fs.StringVar(&o.node, "node", "", "drain this `node` of the cluster only")
	fs.StringVar(&o.topologyZone, "topology-zone", "", "drain the cluster's nodes in this topology `zone` (pgcluster_nodes.zone) only")
	fs.StringVar(&o.reason, "reason", "", fmt.Sprintf("why: a `TEXT` kept with the drain and shown by pgclusterctl drains (required, at most %d characters)", maxReason))
	fs.DurationVar(&o.period, "for", 0, "end the drain after this `duration`, by PostgreSQL's clock (default: when undrained)")
	fs.BoolVar(&o.force, "force", false, "drain even when a guard refuses: a primary, or the last serving nodes of a name")
	fs.BoolVar(&o.json, "json", false, "print the drain made as JSON")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: pgclusterctl drain -postgres DSN -cluster C [-node N | -topology-zone Z]
                         -reason TEXT [-for DURATION] [-force] [-redis URL] [-json]

Takes a node, a whole cluster, or the cluster's nodes in one topology zone
out of every shared name of the cluster (its name, primary., standby.,
replica., prefer-standby., sync., its aliases and SRV records) until -for
passes or pgclusterctl undrain; a drained node keeps its own name. Refused
(exit status 1) when it takes out a primary, or the last serving nodes of
the cluster's name or of standby.; -force drains anyway. Give the options
the fleet's Corefile has: they decide which nodes serve now.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	forGiven := false
	fs.Visit(func(f *flag.Flag) { forGiven = forGiven || f.Name == "for" })
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q: drain takes flags only", fs.Arg(0))
	case o.cluster == "":
		return o, errors.New("-cluster C is required: the cluster to drain, or to drain nodes of")
	case o.node != "" && o.topologyZone != "":
		return o, errors.New("-node and -topology-zone exclude each other: drain one node, or the cluster's nodes in one topology zone")
	case strings.TrimSpace(o.reason) == "":
		return o, errors.New("-reason TEXT is required: why, kept with the drain and shown by pgclusterctl drains")
	case utf8.RuneCountInString(o.reason) > maxReason:
		return o, fmt.Errorf("-reason is %d characters long, longer than the %d pgcluster_drains takes", utf8.RuneCountInString(o.reason), maxReason)
	case forGiven && o.period <= 0:
		return o, fmt.Errorf("-for %v is not positive: give how long the drain lasts (as 30m), or leave -for out for a drain that lasts until undrained", o.period)
	case forGiven && o.period < minPeriod:
		return o, fmt.Errorf("-for %v is shorter than %v: the drain would end before the fleet reads it", o.period, minPeriod)
	}
	return o, o.finish()
}

// drainMade is a drain made, as drain prints it with -json.
type drainMade struct {
	Drain drain `json:"drain"`
	// Warnings say that it matches nothing now, or which guards -force
	// passed.
	Warnings []string `json:"warnings,omitempty"`
}

func runDrain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseDrain(args, stderr)
	if code, done := parsed("drain", err, stderr); done {
		return code
	}
	rdb, dials, err := o.redisClient()
	if err != nil {
		fmt.Fprintln(stderr, "pgclusterctl drain:", err)
		return exitFailed
	}
	if rdb != nil {
		defer rdb.Close()
	}
	ctx, cancel := context.WithTimeout(ctx, roundTimeout)
	defer cancel()
	conn, err := openRegistry(ctx, o.postgres, insertDrains)
	if err != nil {
		fmt.Fprintln(stderr, "pgclusterctl drain:", err)
		return exitFailed
	}
	defer closeRegistry(conn)
	made, refused, err := makeDrain(ctx, conn, o, rdb, dials)
	if err != nil {
		fmt.Fprintln(stderr, "pgclusterctl drain:", err)
		return exitFailed
	}
	if made == nil {
		for _, r := range refused {
			fmt.Fprintln(stderr, "pgclusterctl drain: refused:", r)
		}
		return exitNotOK
	}
	for _, w := range made.Warnings {
		fmt.Fprintln(stderr, "pgclusterctl drain: warning:", w)
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(made)
	} else {
		fmt.Fprintf(stdout, "drain %d made in registry %s\n\n", made.Drain.ID, o.registry)
		err = writeDrains(stdout, []drain{made.Drain})
	}
	if err != nil {
		fmt.Fprintln(stderr, "pgclusterctl drain:", err)
		return exitFailed
	}
	return exitOK
}

// drainLock is taken first in a drain's transaction, held until it ends,
// and taken by every drain of the cluster, in any spelling: two drains of
// one cluster made at once are judged one after the other, the second with
// the first in its count, so that they cannot both pass a guard that one
// of them alone passes. It is an advisory lock, which needs no privilege
// beyond those drain needs anyway, and takes nothing from the fleet's reads
// of pgcluster_drains. Another lock whose key hashes the same only waits
// for it.
const drainLock = `SELECT pg_advisory_xact_lock(hashtext('pgcluster_drains:' || lower($1)))`

// insertDrain makes a drain; it ends $5 seconds after now() by PostgreSQL's
// clock, or when deleted for NULL.
const insertDrain = `INSERT INTO pgcluster_drains (cluster, node, zone, reason, until)
VALUES ($1, NULLIF($2, ''), NULLIF($3, ''), $4, now() + make_interval(secs => $5))
RETURNING id`

// makeDrain makes the drain o asks for, in one transaction: the cluster's
// drain lock; the drain inserted; the nodes, judged as status judges them
// (with rdb, by the fleet's checks too); the cluster's active drains, the
// new one with the nodes it matches; the guards. It commits and returns
// the drain made, or rolls back and returns the refusals, unless o.force.
// The transaction is read committed: each statement after the lock sees
// every drain committed before it was granted. (Under repeatable read the
// snapshot would be the lock statement's own, taken before the lock was
// granted: a drain committed meanwhile would go uncounted.)
func makeDrain(ctx context.Context, conn *pgx.Conn, o drainOptions, rdb redis.UniversalClient, dials *rediserr.Dials) (*drainMade, []refusal, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return nil, nil, registryError(o.registry, err)
	}
	defer tx.Rollback(ctx) // nothing to undo once committed
	if _, err := tx.Exec(ctx, drainLock, o.cluster); err != nil {
		return nil, nil, registryError(o.registry, fmt.Errorf("waiting for the drain lock of %s: %w", o.cluster, err))
	}
	var seconds *float64
	if o.period > 0 {
		s := o.period.Seconds()
		seconds = &s
	}
	var id int64
	if err := tx.QueryRow(ctx, insertDrain, o.cluster, o.node, o.topologyZone, o.reason, seconds).Scan(&id); err != nil {
		return nil, nil, registryError(o.registry, err)
	}
	nodes, err := pgcluster.ReadNodes(ctx, tx)
	if err != nil {
		return nil, nil, registryError(o.registry, err)
	}
	r, err := assess(ctx, o.fleetOptions, nodes, rdb, dials)
	if err != nil {
		return nil, nil, err
	}
	ds, err := readDrains(ctx, tx, false, o.cluster)
	if err != nil {
		return nil, nil, registryError(o.registry, err)
	}
	made := &drainMade{}
	var others []drain
	for _, d := range ds {
		if d.ID == id {
			made.Drain = d
		} else {
			others = append(others, d)
		}
	}
	if made.Drain.ID != id {
		return nil, nil, fmt.Errorf("-postgres: registry %s: drain %d is not read back as active", o.registry, id)
	}
	refused := guards(r, made.Drain, others, o.judge.Zone)
	if len(refused) > 0 && !o.force {
		return nil, refused, nil
	}
	for _, r := range refused {
		made.Warnings = append(made.Warnings, "-force: "+r.what)
	}
	if len(made.Drain.Matches) == 0 {
		made.Warnings = append(made.Warnings, nothingMatched(made.Drain, nodes))
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, nil, registryError(o.registry, err)
	}
	return made, nil, nil
}

// nothingMatched says why d, accepted, matches no node of nodes now, and
// what it does once one joins.
func nothingMatched(d drain, nodes []pgcluster.Node) string {
	known := false
	for _, n := range nodes {
		known = known || strings.EqualFold(n.Cluster, d.Cluster)
	}
	head := fmt.Sprintf("drain %d matches nothing now: ", d.ID)
	switch {
	case !known:
		return head + fmt.Sprintf("pgcluster_nodes has no cluster %s; it drains %s once it joins (check the spelling; pgclusterctl undrain %d ends it)", shown(d.Cluster), d.takesText(), d.ID)
	case d.Node != nil:
		return head + fmt.Sprintf("cluster %s has no node %s in pgcluster_nodes; it drains a node of that name once one joins (check the spelling; pgclusterctl undrain %d ends it)", shown(d.Cluster), shown(*d.Node), d.ID)
	case d.Zone != nil:
		return head + fmt.Sprintf("no node of cluster %s is in topology zone %s; it drains those that join it (check the spelling; pgclusterctl undrain %d ends it)", shown(d.Cluster), shown(*d.Zone), d.ID)
	}
	return head + fmt.Sprintf("cluster %s has no node", shown(d.Cluster))
}

// takesText is what d drains, in a sentence.
func (d drain) takesText() string {
	switch {
	case d.Node != nil:
		return "its node " + shown(*d.Node)
	case d.Zone != nil:
		return "its nodes in topology zone " + shown(*d.Zone)
	}
	return "every node of it"
}
