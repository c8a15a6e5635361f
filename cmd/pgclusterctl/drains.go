package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"

	"github.com/pgcluster/pgcluster"
)

// drain is a row of pgcluster_drains as the commands show it, with the
// nodes it matches now.
type drain struct {
	ID      int64   `db:"id" json:"id"`
	Cluster string  `db:"cluster" json:"cluster"`
	Node    *string `db:"node" json:"node,omitempty"` // one node of the cluster
	Zone    *string `db:"zone" json:"zone,omitempty"` // every node of the cluster in this topology zone
	Reason  string  `db:"reason" json:"reason"`
	// Until is when it ends, by PostgreSQL's clock; nil (null) for a drain
	// that lasts until it is deleted. Left is the time left then, in
	// seconds: negative once it ended.
	Until *time.Time `db:"until" json:"until"`
	Left  *float64   `db:"left_seconds" json:"left_seconds"`
	Ended bool       `db:"ended" json:"ended"`
	By    string     `db:"created_by" json:"created_by"`
	// Created is when it was made, by PostgreSQL's clock.
	Created time.Time `db:"created_at" json:"created_at"`
	// Matches are the nodes of pgcluster_nodes it matches now, by name in
	// lower case: those it takes out of the shared names while it lasts.
	Matches []string `db:"matches" json:"matches"`
}

// drainsQuery reads drains, ended ones ($1) or not, of one cluster ($2) or
// every one, each with the nodes it matches now. A drain matches a node as
// the fleet matches it: cluster, node and topology zone whatever their case
// (lower() on both sides); it is active until PostgreSQL's clock passes
// until.
const drainsQuery = `SELECT d.id, d.cluster, d.node, d.zone, d.reason, d.until,
  extract(epoch FROM d.until - now())::float8 AS left_seconds,
  coalesce(d.until <= now(), false) AS ended,
  d.created_by, d.created_at,
  array(SELECT DISTINCT lower(n.name) FROM pgcluster_nodes n
    WHERE lower(n.cluster) = lower(d.cluster)
      AND (d.node IS NULL OR lower(n.name) = lower(d.node))
      AND (d.zone IS NULL OR lower(n.zone) = lower(d.zone))
    ORDER BY 1) AS matches
FROM pgcluster_drains d
WHERE ($1::boolean OR d.until IS NULL OR d.until > now())
  AND ($2::text IS NULL OR lower(d.cluster) = lower($2::text))
ORDER BY d.id`

// querier is a session or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// readDrains reads the active drains (with all, the ended ones too) of
// cluster, or of every cluster when it is "".
func readDrains(ctx context.Context, q querier, all bool, cluster string) ([]drain, error) {
	var c *string
	if cluster != "" {
		c = &cluster
	}
	rows, err := q.Query(ctx, drainsQuery, all, c)
	if err != nil {
		return nil, err
	}
	ds, err := pgx.CollectRows(rows, pgx.RowToStructByName[drain])
	if err != nil {
		return nil, fmt.Errorf("read pgcluster_drains: %w", err)
	}
	for i := range ds {
		if ds[i].Matches == nil {
			ds[i].Matches = []string{}
		}
		ds[i].Created = ds[i].Created.UTC()
		if ds[i].Until != nil {
			u := ds[i].Until.UTC()
			ds[i].Until = &u
		}
	}
	return ds, nil
}

// takes is what d drains: a node, a topology zone, or its whole cluster.
func (d drain) takes() string {
	switch {
	case d.Node != nil:
		return shown(*d.Node)
	case d.Zone != nil:
		return "zone " + shown(*d.Zone)
	}
	return "(cluster)"
}

// subject names what d drains in a sentence, with the nodes it matches.
func (d drain) subject() string {
	switch {
	case d.Node != nil:
		return shown(*d.Node)
	case d.Zone != nil:
		return fmt.Sprintf("topology zone %s of %s (%s)", shown(*d.Zone), shown(d.Cluster), d.matchesText())
	}
	return fmt.Sprintf("every node of %s (%s)", shown(d.Cluster), d.matchesText())
}

func (d drain) untilText() string {
	if d.Until == nil {
		return "-"
	}
	return d.Until.Format(time.RFC3339)
}

// leftText is the time left on PostgreSQL's clock, to the second.
func (d drain) leftText() string {
	switch {
	case d.Left == nil:
		return "-"
	case d.Ended:
		return "ended"
	}
	return time.Duration(*d.Left * float64(time.Second)).Round(time.Second).String()
}

func (d drain) matchesText() string {
	if len(d.Matches) == 0 {
		return "nothing"
	}
	return strings.Join(d.Matches, ", ")
}

// writeDrains prints drains as a table.
func writeDrains(w io.Writer, ds []drain) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tCLUSTER\tNODE/ZONE\tREASON\tUNTIL\tLEFT\tBY\tCREATED\tMATCHES")
	for _, d := range ds {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.ID, shown(d.Cluster), d.takes(), shown(d.Reason),
			d.untilText(), d.leftText(), shown(d.By), d.Created.Format(time.RFC3339), d.matchesText())
	}
	return tw.Flush()
}

// shown is text from the registry made safe for a terminal and a table:
// every character that does not print (a tab, an escape) shown as '?'.
func shown(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return '?'
	}, s)
}

// drainsOptions are drains's command line.
type drainsOptions struct {
	postgres string
	all      bool
	json     bool
}

// drainList is what drains prints with -json.
type drainList struct {
	Registry string  `json:"registry"` // host:port/database
	All      bool    `json:"all"`      // ended drains are listed too
	Drains   []drain `json:"drains"`
}

func parseDrains(args []string, stderr io.Writer) (drainsOptions, error) {
	var o drainsOptions
	fs := flag.NewFlagSet("pgclusterctl drains", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.postgres, "postgres", "", "the registry `DSN`, as the fleet's postgres option (required)")
	fs.BoolVar(&o.all, "all", false, "list ended drains too (their until passed), marked ended")
	fs.BoolVar(&o.json, "json", false, "print JSON")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: pgclusterctl drains -postgres DSN [-all] [-json]

The active drains of pgcluster_drains: what each takes out of the shared
names, why, until when (by PostgreSQL's clock) and the nodes it matches now.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected argument %q: drains takes flags only", fs.Arg(0))
	case o.postgres == "":
		return o, errors.New("-postgres DSN is required: the registry to read")
	}
	return o, nil
}

func runDrains(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseDrains(args, stderr)
	if code, done := parsed("drains", err, stderr); done {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, roundTimeout)
	defer cancel()
	registry := pgcluster.RegistryName(o.postgres)
	conn, err := openRegistry(ctx, o.postgres, readOnly)
	if err != nil {
		fmt.Fprintln(stderr, "pgclusterctl drains:", err)
		return exitFailed
	}
	defer closeRegistry(conn)
	ds, err := readDrains(ctx, conn, o.all, "")
	if err != nil {
		fmt.Fprintln(stderr, "pgclusterctl drains:", registryError(registry, err))
		return exitFailed
	}
	if err := writeDrainList(stdout, drainList{Registry: registry, All: o.all, Drains: ds}, o.json); err != nil {
		fmt.Fprintln(stderr, "pgclusterctl drains:", err)
		return exitFailed
	}
	return exitOK
}

func writeDrainList(w io.Writer, l drainList, asJSON bool) error {
	if asJSON {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(l)
	}
	active := 0
	for _, d := range l.Drains {
		if !d.Ended {
			active++
		}
	}
	fmt.Fprintf(w, "registry %s: %s", l.Registry, plural(active, "active drain"))
	if l.All {
		fmt.Fprintf(w, ", %d ended", len(l.Drains)-active)
	}
	if len(l.Drains) == 0 {
		_, err := fmt.Fprintln(w)
		return err
	}
	fmt.Fprint(w, "\n\n")
	return writeDrains(w, l.Drains)
}

// plural is n things: "1 drain", "2 drains", "no drain".
func plural(n int, thing string) string {
	switch n {
	case 0:
		return "no " + thing
	case 1:
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
