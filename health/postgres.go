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

// pgQuery reads, in one round trip and with pg_is_in_recovery() read once
// (a primary cannot go back into recovery under a running query), the role,
// the WAL position (pg_current_wal_lsn() on a primary,
// pg_last_wal_replay_lsn() on a standby), a primary's timeline from its
// current WAL file's name (a checkpoint's timeline lags a promotion by
// minutes), the system identifier, and a primary's standbys as it sees
// them (replicasColumn).
const pgQuery = `SELECT r,
  CASE WHEN r THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END,
  CASE WHEN r THEN 0 ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END,
  (SELECT system_identifier FROM pg_control_system()),
  ` + replicasColumn + `
FROM (SELECT pg_is_in_recovery() AS r) s`

// postgresProbe returns the postgres check: connect to the target with opts
// (the host and port are the target's; connect_timeout is timeout), read the
// role, WAL position, timeline and system identifier, close. The options are
// parsed at every probe, as libpq does at every connect, so a changed
// passfile or certificate is used from the next probe on.
func postgresProbe(opts string, timeout time.Duration, source netip.Addr) probeFunc {
	return func(ctx context.Context, addr netip.AddrPort) result {
		conn, res := pgConnect(ctx, opts, timeout, source, addr)
		if conn == nil {
			return res
		}
		defer conn.Close(ctx)
		return pgRead(ctx, conn)
	}
}

// pgRead runs pgQuery on conn.
func pgRead(ctx context.Context, conn *pgconn.PgConn) result {
	rows, err := conn.Exec(ctx, pgQuery).ReadAll()
	if err != nil {
		return failure(pgCause(err, stageReady), err)
	}
	res, err := parseRow(rows)
	if err != nil {
		return failure(CauseProtocol, err)
	}
	return res
}

// pgConnect opens a session to addr with opts, connect_timeout timeout,
// from source when valid (see dialer). On failure it returns nil and the
// failed result.
func pgConnect(ctx context.Context, opts string, timeout time.Duration, source netip.Addr, addr netip.AddrPort) (*pgconn.PgConn, result) {
	host := addr.Addr().Unmap().String()
	cfg, err := pgconn.ParseConfig(connString(opts, host, addr.Port()))
	if err != nil {
		return nil, failure(CauseConfig, err)
	}
	cfg.ConnectTimeout = timeout
	stage := stageNone
	dialNet := cfg.DialFunc
	if source.IsValid() {
		dialNet = func(ctx context.Context, network, address string) (net.Conn, error) {
			return dial(ctx, timeout, source, addr.Addr(), network, address)
		}
	}
	cfg.DialFunc = func(ctx context.Context, network, address string) (net.Conn, error) {
		conn, err := dialNet(ctx, network, address)
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
		return nil, result{cause: pgCause(err, stage), detail: bound(connectDetail(err))}
	}
	return conn, result{cause: CauseOK}
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

// parseRow reads pgQuery's one row: the role from pg_is_in_recovery(), the
// LSN (0 when NULL), the timeline (0 on a standby), the system identifier
// and a primary's replicas.
func parseRow(rs []*pgconn.Result) (result, error) {
	if len(rs) != 1 || len(rs[0].Rows) != 1 || len(rs[0].Rows[0]) != 5 {
		return result{}, errors.New("the role and WAL query did not return one row of five columns")
	}
	row := rs[0].Rows[0]
	res := result{cause: CauseOK}
	var err error
	if res.role, err = parseRole(row[0]); err != nil {
		return result{}, err
	}
	if row[1] != nil {
		if res.wal, err = parseLSN(string(row[1])); err != nil {
			return result{}, err
		}
	}
	tl, err := strconv.ParseInt(string(row[2]), 10, 64)
	if err != nil || tl < 0 || tl > 1<<32-1 {
		return result{}, fmt.Errorf("timeline %q is not a 32-bit number", row[2])
	}
	res.tl = uint32(tl)
	id, err := strconv.ParseInt(string(row[3]), 10, 64)
	if err != nil {
		return result{}, fmt.Errorf("system identifier %q is not a bigint", row[3])
	}
	res.sysID = uint64(id)
	if res.repl, res.replHidden, err = parseReplicas(row[4]); err != nil {
		return result{}, err
	}
	return res, nil
}

// parseRole reads pg_is_in_recovery()'s text: t is a standby, f a primary.
func parseRole(b []byte) (string, error) {
	switch string(b) {
	case "f":
		return RolePrimary, nil
	case "t":
		return RoleStandby, nil
	}
	return "", fmt.Errorf("pg_is_in_recovery() returned %q, not t or f", b)
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
