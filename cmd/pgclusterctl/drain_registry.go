package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgcluster/pgcluster"
)

// What the drain commands need of the registry: pgcluster_drains (this
// version's schema.sql) and the privileges to use it. Both are looked up
// before any statement that needs them, so that a missing table or GRANT
// is named with what to do, whatever language the server speaks.

// accessQuery says what the session's role may do with the tables the drain
// commands use; it cannot fail on a registry that lacks them.
const accessQuery = `SELECT quote_ident(current_user),
  to_regclass('pgcluster_nodes') IS NOT NULL,
  to_regclass('pgcluster_drains') IS NOT NULL,
  coalesce(has_table_privilege(to_regclass('pgcluster_nodes'), 'SELECT'), false),
  coalesce(has_table_privilege(to_regclass('pgcluster_drains'), 'SELECT'), false),
  coalesce(has_table_privilege(to_regclass('pgcluster_drains'), 'INSERT'), false),
  coalesce(has_table_privilege(to_regclass('pgcluster_drains'), 'DELETE'), false),
  coalesce(has_sequence_privilege(to_regclass('pgcluster_drains_id_seq'), 'USAGE, UPDATE'), false)`

// What a command writes to pgcluster_drains: nothing (drains), rows
// (drain), or it deletes them (undrain).
const (
	readOnly     = ""
	insertDrains = "INSERT"
	deleteDrains = "DELETE"
)

// closeTimeout bounds closing a registry session.
const closeTimeout = time.Second

// openRegistry connects to the registry at dsn as status does, and checks
// that its role may read pgcluster_nodes and pgcluster_drains and, as
// write says, insert or delete drains. Its errors say what to do and never
// contain the password.
func openRegistry(ctx context.Context, dsn, write string) (*pgx.Conn, error) {
	conn, err := pgcluster.ConnectRegistry(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("-postgres: %w", err)
	}
	if err := checkAccess(ctx, conn, pgcluster.RegistryName(dsn), write); err != nil {
		closeRegistry(conn)
		return nil, err
	}
	return conn, nil
}

func checkAccess(ctx context.Context, conn *pgx.Conn, registry, write string) error {
	var user string
	var nodes, drains, selectNodes, selectDrains, insert, del, sequence bool
	if err := conn.QueryRow(ctx, accessQuery).Scan(&user, &nodes, &drains, &selectNodes, &selectDrains, &insert, &del, &sequence); err != nil {
		return registryError(registry, err)
	}
	grant := "GRANT SELECT, INSERT, DELETE ON pgcluster_drains TO " + user + "; GRANT USAGE ON SEQUENCE pgcluster_drains_id_seq TO " + user
	var missing []string
	switch {
	case !nodes:
		return fmt.Errorf("-postgres: registry %s has no registry tables. To fix: apply schema.sql to the DSN's database", registry)
	case !drains:
		return fmt.Errorf("-postgres: registry %s has no pgcluster_drains table: it was made by a version without drains. To fix: apply this version's schema.sql", registry)
	case !selectNodes:
		return fmt.Errorf("-postgres: registry %s denies %s SELECT on pgcluster_nodes (permission denied). To fix: GRANT SELECT ON pgcluster_nodes TO %s", registry, user, user)
	}
	if !selectDrains {
		missing = append(missing, "SELECT on pgcluster_drains")
	}
	if write == insertDrains && !insert {
		missing = append(missing, "INSERT on pgcluster_drains")
	}
	if write == deleteDrains && !del {
		missing = append(missing, "DELETE on pgcluster_drains")
	}
	if write == insertDrains && !sequence {
		missing = append(missing, "USAGE on the sequence pgcluster_drains_id_seq")
	}
	if len(missing) > 0 {
		return fmt.Errorf("-postgres: registry %s denies %s %s (permission denied). To fix: %s", registry, user, strings.Join(missing, ", "), grant)
	}
	return nil
}

// registryError is a failed statement: the registry and PostgreSQL's error.
func registryError(registry string, err error) error {
	return fmt.Errorf("-postgres: registry %s: %w", registry, err)
}

// closeRegistry ends a session, waiting no longer than closeTimeout.
func closeRegistry(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	conn.Close(ctx)
}
