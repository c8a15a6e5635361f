package health

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// pgQuery reads the role and the WAL position in one round trip.
const pgQuery = "SELECT pg_is_in_recovery(), CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END"

// postgresProbe returns the postgres check: connect to the target with opts
// (the host and port are the target's; connect_timeout is timeout), read the
// role and WAL position, close. The options are parsed at every probe, as
// libpq does at every connect, so a changed passfile or certificate is used
// from the next probe on.
func postgresProbe(opts string, timeout time.Duration) probeFunc {
	return func(ctx context.Context, addr netip.AddrPort) result {
		host := addr.Addr().Unmap().String()
		cfg, err := pgconn.ParseConfig(connString(opts, host, addr.Port()))
		if err != nil {
			return failure(CauseConfig, err)
		}
		cfg.ConnectTimeout = timeout
		stage := stageNone
		dial := cfg.DialFunc
		cfg.DialFunc = func(ctx context.Context, network, address string) (net.Conn, error) {
			conn, err := dial(ctx, network, address)
			if err == nil {
				stage = max(stage, stageDialed)
			}
			return conn, err
		}
		afterNet := cfg.AfterNetConnect
		cfg.AfterNetConnect = func(ctx context.Context, cfg *pgconn.Config, conn net.Conn) (net.Conn, error) {
			stage = stageReady
			if afterNet != nil {
				return afterNet(ctx, cfg, conn)
			}
			return conn, nil
		}
		conn, err := pgconn.ConnectConfig(ctx, cfg)
		if err != nil {
			return result{cause: pgCause(err, stage), detail: bound(connectDetail(err))}
		}
		defer conn.Close(ctx)
		rows, err := conn.Exec(ctx, pgQuery).ReadAll()
		if err != nil {
			return failure(pgCause(err, stageReady), err)
		}
		role, wal, err := parseRow(rows)
		if err != nil {
			return failure(CauseProtocol, err)
		}
		return result{cause: CauseOK, role: role, wal: wal}
	}
}

// connectDetail is the text of a connect error without pgconn's prefix,
// one line per distinct attempt error.
func connectDetail(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Error()
	}
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) || errors.Unwrap(ce) == nil {
		return err.Error()
	}
	inner := errors.Unwrap(ce)
	joined, ok := inner.(interface{ Unwrap() []error })
	if !ok {
		return inner.Error()
	}
	var lines []string
	for _, e := range joined.Unwrap() {
		if line := e.Error(); !contains(lines, line) {
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "; ")
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// parseRow reads pgQuery's one row: the role from pg_is_in_recovery() and
// the LSN (0 when NULL).
func parseRow(rs []*pgconn.Result) (role string, wal uint64, err error) {
	if len(rs) != 1 || len(rs[0].Rows) != 1 || len(rs[0].Rows[0]) != 2 {
		return "", 0, errors.New("the role and WAL query did not return one row of two columns")
	}
	row := rs[0].Rows[0]
	switch string(row[0]) {
	case "f":
		role = RolePrimary
	case "t":
		role = RoleStandby
	default:
		return "", 0, fmt.Errorf("pg_is_in_recovery() returned %q, not t or f", row[0])
	}
	if row[1] == nil {
		return role, 0, nil
	}
	wal, err = parseLSN(string(row[1]))
	return role, wal, err
}

// parseLSN parses pg_lsn text, "X/Y" with X the high and Y the low 32 bits in hex.
func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if ok {
		h, herr := strconv.ParseUint(hi, 16, 32)
		l, lerr := strconv.ParseUint(lo, 16, 32)
		if herr == nil && lerr == nil {
			return h<<32 | l, nil
		}
	}
	return 0, fmt.Errorf("WAL position %q is not a pg_lsn (X/Y in hex)", s)
}
