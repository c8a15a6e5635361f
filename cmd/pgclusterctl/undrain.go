package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"

	"github.com/jackc/pgx/v5"

	"github.com/pgcluster/pgcluster"
)

// undrainOptions are undrain's command line: a drain's ID, or a node whose
// drains to delete.
type undrainOptions struct {
	postgres string
	id       int64
	cluster  string
	node     string
}

func parseUndrain(args []string, stderr io.Writer) (undrainOptions, error) {
	var o undrainOptions
	fs := flag.NewFlagSet("pgclusterctl undrain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.postgres, "postgres", "", "the registry `DSN`, as the fleet's postgres option (required)")
	fs.StringVar(&o.cluster, "cluster", "", "with -node: the `cluster` of the node")
	fs.StringVar(&o.node, "node", "", "delete every drain of this `node` (with -cluster)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: pgclusterctl undrain -postgres DSN ID
       pgclusterctl undrain -postgres DSN -cluster C -node N

Deletes a drain by its ID (pgclusterctl drains lists them), or every drain
of one node: its names serve it again as soon as the fleet reads the change.
A drain of a whole cluster or of a topology zone is deleted by its ID.
Exit status 1 when no drain matched.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.postgres == "":
		return o, errors.New("-postgres DSN is required: the registry to change")
	case fs.NArg() > 1:
		return o, fmt.Errorf("unexpected argument %q: give one drain ID, after the flags", fs.Arg(1))
	case fs.NArg() == 1 && (o.cluster != "" || o.node != ""):
		return o, errors.New("give a drain ID, or -cluster and -node, not both")
	case fs.NArg() == 1:
		id, err := strconv.ParseInt(fs.Arg(0), 10, 64)
		if err != nil || id <= 0 {
			return o, fmt.Errorf("%q is not a drain ID: pgclusterctl drains lists them", fs.Arg(0))
		}
		o.id = id
	case o.cluster == "" || o.node == "":
		return o, errors.New("give a drain ID (pgclusterctl drains lists them), or -cluster C -node N for the drains of one node")
	}
	return o, nil
}

// The deletes return what they deleted.
const (
	deleteDrainByID = `DELETE FROM pgcluster_drains WHERE id = $1
RETURNING id, cluster, node, zone, reason`
	deleteDrainsOfNode = `DELETE FROM pgcluster_drains WHERE lower(cluster) = lower($1) AND lower(node) = lower($2)
RETURNING id, cluster, node, zone, reason`
)

func runUndrain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseUndrain(args, stderr)
	if code, done := parsed("undrain", err, stderr); done {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, roundTimeout)
	defer cancel()
	registry := pgcluster.RegistryName(o.postgres)
	conn, err := openRegistry(ctx, o.postgres, deleteDrains)
	if err != nil {
		fmt.Fprintln(stderr, "pgclusterctl undrain:", err)
		return exitFailed
	}
	defer closeRegistry(conn)
	var rows pgx.Rows
	if o.id != 0 {
		rows, err = conn.Query(ctx, deleteDrainByID, o.id)
	} else {
		rows, err = conn.Query(ctx, deleteDrainsOfNode, o.cluster, o.node)
	}
	var deleted []drain
	if err == nil {
		deleted, err = pgx.CollectRows(rows, pgx.RowToStructByNameLax[drain])
	}
	if err != nil {
		fmt.Fprintln(stderr, "pgclusterctl undrain:", registryError(registry, err))
		return exitFailed
	}
	switch {
	case len(deleted) == 0 && o.id != 0:
		fmt.Fprintf(stderr, "pgclusterctl undrain: registry %s has no drain %d (pgclusterctl drains -all lists them)\n", registry, o.id)
		return exitNotOK
	case len(deleted) == 0:
		fmt.Fprintf(stderr, "pgclusterctl undrain: registry %s has no drain of node %s in cluster %s (pgclusterctl drains -all lists them; a drain of a whole cluster or of a topology zone is deleted by its ID)\n",
			registry, shown(o.node), shown(o.cluster))
		return exitNotOK
	}
	for _, d := range deleted {
		fmt.Fprintf(stdout, "deleted drain %d of %s: %s (%s)\n", d.ID, shown(d.Cluster), d.takesText(), shown(d.Reason))
	}
	fmt.Fprintf(stdout, "%s deleted from registry %s\n", plural(len(deleted), "drain"), registry)
	return exitOK
}
