package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// problem is what went wrong with the registry, and what to do about it, in
// an operator's words.
type problem struct {
	what string // "unreachable", "denies access to the registry tables", ...
	todo string
}

// diagnose says what a failed registry session means. user is the DSN's
// user, named in the hints that need one ("" for the DSN's user).
func diagnose(err error, user string) problem {
	if user == "" {
		user = "the DSN's user"
	} else {
		user = fmt.Sprintf("%q", user)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return diagnoseSQL(pgErr.Code, user)
	}
	var parseErr *pgconn.ParseConfigError
	if errors.As(err, &parseErr) {
		return problem{"has a DSN that cannot be parsed", "fix the postgres option in the Corefile (a URL postgres://user@host:port/db or key=value pairs)"}
	}
	var scanErr pgx.ScanArgError
	if errors.As(err, &scanErr) {
		return problem{"has registry columns of a type this version cannot read", "compare the tables with schema.sql and ALTER the column the error names to its type there"}
	}
	if unreachable(err) {
		return problem{"unreachable", "check that PostgreSQL runs and that the DSN's host and port reach it; retrying with backoff"}
	}
	return problem{"failed", "see the error; retrying with backoff"}
}

// diagnoseSQL explains a SQLSTATE the server sent.
func diagnoseSQL(code, user string) problem {
	switch code {
	case "42501":
		return problem{"denies access to the registry tables (permission denied)", "GRANT SELECT ON pgcluster_nodes, pgcluster_aliases, pgcluster_networks, pgcluster_drains TO " + user}
	case "42P01":
		return problem{"has no registry tables", "apply schema.sql to the DSN's database"}
	case "42703":
		return problem{"has a registry schema older than this version (a column is missing)", "apply schema.sql, or ALTER TABLE to add the column the error names"}
	case "28P01", "28000":
		return problem{"refuses the login", "check the user and password in the postgres DSN, and pg_hba.conf"}
	case "3D000":
		return problem{"has no such database", "create it, or fix the database name in the postgres DSN"}
	case "53300":
		return problem{"has no connection slot free (too many connections)", "raise max_connections or close idle clients; retrying with backoff"}
	case "57P03":
		return problem{"is starting up", "wait: retrying with backoff until it accepts connections"}
	case "57014":
		// The server runs and answers: it cancelled the query.
		return problem{"cancelled a registry query (statement_timeout, or a cancel request)",
			"reset statement_timeout for " + user + " (ALTER ROLE ... RESET statement_timeout) or raise it above a registry read, and look for a session that cancels its queries or holds a lock on pgcluster_nodes or pgcluster_aliases; retrying with backoff"}
	case "55P03":
		return problem{"holds a lock on a registry table past lock_timeout",
			"look in pg_locks for the session that holds a lock on pgcluster_nodes or pgcluster_aliases (an ALTER TABLE, TRUNCATE or LOCK TABLE left open) and end it, or raise lock_timeout for " + user + "; retrying with backoff"}
	}
	switch {
	case strings.HasPrefix(code, "22"):
		return problem{"holds data this version cannot read", "fix or delete the row the error names, then apply schema.sql so that such rows are refused"}
	case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "57"):
		return problem{"unreachable (the server ended the connection)", "check that PostgreSQL runs; retrying with backoff"}
	}
	return problem{"failed a registry query (SQLSTATE " + code + ")", "see the error; retrying with backoff"}
}

// unreachable reports whether err means the server could not be reached or
// stopped answering: refused, reset, timed out, name not found.
func unreachable(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || pgconn.Timeout(err) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed)
}

// downMessage is the log line for a failed session: what is wrong, what the
// answers are meanwhile (served says whether there is a snapshot to answer
// from), what to do, and the error itself.
func downMessage(dsn string, p problem, served bool, errText string) string {
	meanwhile := "answers keep coming from the last snapshot"
	if !served {
		meanwhile = "no snapshot yet: the zone answers SERVFAIL and is not ready until the registry loads"
	}
	return fmt.Sprintf("Registry %s %s; %s. To fix: %s. Error: %s", dsn, p.what, meanwhile, p.todo, errText)
}
