package pgtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
)

// StreamingTimeout bounds how long StartStandby waits for a new standby to
// stream from its primary.
const StreamingTimeout = 30 * time.Second

// StartStandby makes a streaming-replication standby of primary with
// pg_basebackup -R (fast checkpoint, WAL streamed along), on its own address
// and port (opts.Host, opts.Port, as for Start), starts it, and waits until it
// is in recovery and its WAL receiver is streaming. opts.Settings are added to
// the settings copied from primary. Close the standby like any server.
func StartStandby(primary *Postgres, opts Options) (*Postgres, error) {
	if primary == nil {
		return nil, errors.New("pgtest: StartStandby needs a running primary, got nil")
	}
	host, err := opts.host()
	if err != nil {
		return nil, err
	}
	p, err := newPostgres(primary.bin, host)
	if err != nil {
		return nil, err
	}
	if p.Dir, err = p.mkdir(opts.Dir, "pgtest-standby-"); err != nil {
		return nil, err
	}
	out, err := p.run(filepath.Join(p.bin, "pg_basebackup"), "-h", primary.host(), "-p", strconv.Itoa(primary.Port),
		"-U", "postgres", "-D", p.data(), "-R", "-X", "stream", "-c", "fast", "--no-sync")
	if err != nil {
		os.RemoveAll(p.Dir)
		return nil, fmt.Errorf("pg_basebackup from the primary at %s: %v: %s", primary.DSN(""), err, out)
	}
	// postgresql.conf came from the primary: its address and socket directory
	// are overridden by lines appended after them.
	if err := p.serve(opts, ""); err != nil {
		return nil, err
	}
	if err := p.WaitStreaming(StreamingTimeout); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// WaitStreaming waits up to timeout until the server is in recovery and its
// WAL receiver streams from the primary (pg_stat_wal_receiver.status is
// 'streaming'), as after StartStandby or after restarting a standby.
func (p *Postgres) WaitStreaming(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := WaitFor(timeout, func() error {
		var (
			recovery bool
			status   string
		)
		err := p.queryRow(ctx, `SELECT pg_is_in_recovery(), coalesce((SELECT status FROM pg_stat_wal_receiver), 'no WAL receiver')`, &recovery, &status)
		switch {
		case err != nil:
			return err
		case !recovery:
			return errors.New("the server is not in recovery (a primary, not a standby)")
		case status != "streaming":
			return fmt.Errorf("WAL receiver status is %q, not \"streaming\"", status)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("standby at %s does not stream from its primary: %w%s", p.DSN(""), err, p.logTail())
	}
	return nil
}

// Promote turns a standby into a primary (pg_ctl promote -w) and returns once
// it has left recovery and accepts writes.
func (p *Postgres) Promote() error {
	out, err := p.run(filepath.Join(p.bin, "pg_ctl"), "-D", p.data(), "-w", "-t", "60", "promote")
	if err != nil {
		return fmt.Errorf("pg_ctl promote: %v: %s%s", err, out, p.logTail())
	}
	return nil
}

// InRecovery reports pg_is_in_recovery(): true on a standby, false on a primary.
func (p *Postgres) InRecovery(ctx context.Context) (bool, error) {
	var r bool
	err := p.queryRow(ctx, "SELECT pg_is_in_recovery()", &r)
	return r, err
}

// PauseReplay pauses WAL replay on a standby (pg_wal_replay_pause()) and waits
// until replay has stopped (pg_get_wal_replay_pause_state() is 'paused',
// PostgreSQL 14 or later), so that nothing written on the primary afterwards
// is replayed until ResumeReplay. The standby still receives WAL meanwhile.
func (p *Postgres) PauseReplay(ctx context.Context) error {
	if err := p.Exec(ctx, "SELECT pg_wal_replay_pause()"); err != nil {
		return fmt.Errorf("pause replay on %s: %w", p.DSN(""), err)
	}
	const timeout = 10 * time.Second
	err := WaitFor(timeout, func() error {
		var state string
		if err := p.queryRow(ctx, "SELECT pg_get_wal_replay_pause_state()", &state); err != nil {
			return err
		}
		if state != "paused" {
			return fmt.Errorf("replay pause state is %q, not \"paused\"", state)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("pause replay on %s: %w", p.DSN(""), err)
	}
	return nil
}

// ResumeReplay resumes WAL replay paused by PauseReplay (pg_wal_replay_resume()).
func (p *Postgres) ResumeReplay(ctx context.Context) error {
	if err := p.Exec(ctx, "SELECT pg_wal_replay_resume()"); err != nil {
		return fmt.Errorf("resume replay on %s: %w", p.DSN(""), err)
	}
	return nil
}

// CurrentLSN returns the primary's current WAL write position
// (pg_current_wal_lsn()) in bytes: what a standby's ReplayLSN is compared with.
// It fails on a server in recovery.
func (p *Postgres) CurrentLSN(ctx context.Context) (uint64, error) {
	var n int64
	if err := p.queryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint", &n); err != nil {
		return 0, fmt.Errorf("current WAL position of %s: %w", p.DSN(""), err)
	}
	return uint64(n), nil
}

// ReplayLSN returns the position up to which a standby has replayed WAL
// (pg_last_wal_replay_lsn()) in bytes. It fails on a server that never was in
// recovery.
func (p *Postgres) ReplayLSN(ctx context.Context) (uint64, error) {
	var n *int64
	if err := p.queryRow(ctx, "SELECT pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')::bigint", &n); err != nil {
		return 0, fmt.Errorf("replayed WAL position of %s: %w", p.DSN(""), err)
	}
	if n == nil {
		return 0, fmt.Errorf("replayed WAL position of %s: none, the server never was a standby", p.DSN(""))
	}
	return uint64(*n), nil
}

// queryRow runs one query on a new connection to database postgres and scans its row.
// QueryRow runs sql in database postgres and scans its one row into dest.
func (p *Postgres) QueryRow(ctx context.Context, sql string, dest ...any) error {
	return p.queryRow(ctx, sql, dest...)
}

func (p *Postgres) queryRow(ctx context.Context, sql string, dest ...any) error {
	conn, err := pgx.Connect(ctx, p.DSN(""))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(dest...)
}
