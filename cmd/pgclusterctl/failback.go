package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/pgcluster/pgcluster"
)

// failbackOptions are failback's command line: the alias to point at its
// own target again.
type failbackOptions struct {
	postgres string
	alias    string
}

func parseFailback(args []string, stderr io.Writer) (failbackOptions, error) {
	var o failbackOptions
	fs := flag.NewFlagSet("pgclusterctl failback", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.postgres, "postgres", "", "the registry `DSN`, as the fleet's postgres option (required)")
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: pgclusterctl failback -postgres DSN ALIAS

Points an alias that failed over to a fallback at its own target again, on
every instance as soon as the fleet reads the change: it deletes the
alias's row of pgcluster_alias_state, where the fleet's follower wrote the
move. Run it once the target's primary is the one writes should go to (a
returning site's old primary may have missed what was written at the
fallback). Should the target still not serve, the alias fails over again
after failover_after. Exit status 1 when the alias points at its own
target already.

`)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case o.postgres == "":
		return o, errors.New("-postgres DSN is required: the registry to change")
	case fs.NArg() != 1:
		return o, errors.New("give one alias, after the flags")
	}
	o.alias = fs.Arg(0)
	return o, nil
}

// failbackQuery deletes the alias's move and says where it pointed.
const failbackQuery = `DELETE FROM pgcluster_alias_state s USING pgcluster_aliases a
WHERE lower(s.alias) = lower($1) AND a.alias = s.alias
RETURNING s.alias, a.target, s.target AS moved, s.reason, s.moved_at`

func runFailback(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFailback(args, stderr)
	if code, done := parsed("failback", err, stderr); done {
		return code
	}
	ctx, cancel := context.WithTimeout(ctx, roundTimeout)
	defer cancel()
	registry := pgcluster.RegistryName(o.postgres)
	conn, err := pgcluster.ConnectRegistry(ctx, o.postgres)
	if err != nil {
		fmt.Fprintln(stderr, "pgclusterctl failback: -postgres:", err)
		return exitFailed
	}
	defer closeRegistry(conn)
	rows, err := conn.Query(ctx, failbackQuery, o.alias)
	if err != nil {
		fmt.Fprintln(stderr, "pgclusterctl failback:", registryError(registry, err),
			"(a registry made by a version without fail-over: apply this version's schema.sql; permission denied: GRANT SELECT ON pgcluster_aliases, pgcluster_alias_state and DELETE ON pgcluster_alias_state to the DSN's role)")
		return exitFailed
	}
	n := 0
	for rows.Next() {
		var alias, target, moved, reason string
		var at any
		if err := rows.Scan(&alias, &target, &moved, &reason, &at); err != nil {
			fmt.Fprintln(stderr, "pgclusterctl failback:", registryError(registry, err))
			return exitFailed
		}
		n++
		fmt.Fprintf(stdout, "alias %s points at %s again (it had failed over to %s at %v: %s)\n", shown(alias), shown(target), shown(moved), at, shown(reason))
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintln(stderr, "pgclusterctl failback:", registryError(registry, err))
		return exitFailed
	}
	if n == 0 {
		fmt.Fprintf(stderr, "pgclusterctl failback: alias %s of registry %s has not failed over: it points at its own target\n", shown(o.alias), registry)
		return exitNotOK
	}
	return exitOK
}
