package health

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"time"
)

// Target is one backend to check. Key is the caller's name for it ("cluster/name").
type Target struct {
	Key  string
	Addr netip.AddrPort
}

// State is a target's judged state after rise and fall.
type State uint8

const (
	// Unknown means not checked yet, or not enough results for rise or fall.
	Unknown State = iota
	// Up means Rise consecutive probes succeeded, and fewer than Fall failed in a row since.
	Up
	// Down means Fall consecutive probes failed, and fewer than Rise succeeded in a row since.
	Down
)

// String returns "unknown", "up" or "down".
func (s State) String() string {
	switch s {
	case Up:
		return "up"
	case Down:
		return "down"
	default:
		return "unknown"
	}
}

// Role values a postgres check reports ("" for tcp).
const (
	RolePrimary = "primary"
	RoleStandby = "standby"
)

// Check names accepted in Config.Check.
const (
	CheckTCP      = "tcp"
	CheckPostgres = "postgres"
)

// Causes: the stable words of Verdict.Cause and of the Observe hook.
const (
	CauseOK                 = "ok"                   // the probe succeeded
	CauseRefused            = "refused"              // the connection was refused (ECONNREFUSED)
	CauseTimeout            = "timeout"              // no answer within Timeout
	CauseLate               = "late"                 // Observe only: a timeout this process saw late (starved of CPU), not judged (see LateAfter)
	CauseUnreachable        = "unreachable"          // the connection failed otherwise (no route, host down...)
	CauseStartingUp         = "starting_up"          // SQLSTATE 57P03 cannot_connect_now (starting up, shutting down, recovery)
	CauseShuttingDown       = "shutting_down"        // SQLSTATE 57P01 admin_shutdown, 57P02 crash_shutdown
	CauseTooManyConnections = "too_many_connections" // SQLSTATE 53300
	CauseAuthFailed         = "auth_failed"          // SQLSTATE class 28 (bad password, no such role, no LOGIN) or 42501 (no CONNECT privilege)
	CauseNoDatabase         = "no_database"          // SQLSTATE 3D000
	CauseTLS                = "tls"                  // the TLS negotiation or handshake failed
	CauseProtocol           = "protocol"             // the peer accepted the connection but did not speak PostgreSQL's protocol as expected
	CauseConfig             = "config"               // the postgres Options could not be turned into a connection (a file they name, for instance)
	CauseError              = "error"                // any other error
)

// Defaults applied by New to zero Config fields.
const (
	DefaultInterval = 2 * time.Second
	DefaultTimeout  = 1 * time.Second
	DefaultRise     = 2
	DefaultFall     = 2
	// DefaultRoleInterval is how often the postgres check reads the role on
	// the session it keeps open to a node it probes.
	DefaultRoleInterval = 100 * time.Millisecond
	// NoSessions, as Config.RoleInterval, keeps no session open: the role is
	// read only by the probe of every Interval.
	NoSessions time.Duration = -1
)

// maxDetail bounds Verdict.Detail, in bytes.
const maxDetail = 200

// Verdict is a target's judged state after rise/fall.
//
// Its fields are ordered so that it takes 120 bytes: a map stores a value
// of more than 128 bytes apart from its slot, one allocation per entry, and
// a View of thousands of targets, made for every change the fleet
// publishes, then costs as many allocations.
type Verdict struct {
	State State
	// Leaving: the server ended the check's session (it is shutting down or died, or someone
	// ended the session) and the probe that tells which is in flight. A primary that is
	// leaving does not make a split brain with one that has just been promoted.
	Leaving bool
	// ReplicasHidden: the check's role may not read the replicas' columns (it lacks
	// pg_monitor), so they are unknown, not absent (see Replicas).
	ReplicasHidden bool
	// Timeline is, for a primary, the timeline it writes WAL on (from its current WAL file's name:
	// a promotion moves it at once, where a checkpoint's lags by minutes); 0 when unknown, for a
	// standby and for tcp.
	Timeline uint32
	// Role is, for the postgres check, "primary" or "standby" from pg_is_in_recovery() as read
	// by the last successful probe; "" for tcp or when never read.
	Role string
	// WAL is the LSN read by the last successful postgres probe: pg_current_wal_lsn() on a
	// primary, pg_last_wal_replay_lsn() on a standby (0 when unknown / tcp).
	WAL uint64
	// SystemID is the server's database system identifier (pg_control_system()): servers made
	// from one initdb (a primary and its standbys) share it. 0 when unknown and for tcp.
	SystemID uint64
	// Replicas is, for the postgres check of a primary, its standbys as pg_stat_replication
	// showed them to the last successful probe, in name order (empty when it has none); nil
	// for a standby, for tcp and when never read.
	Replicas []Replica
	// Cause is a stable word (the Cause* constants): the last probe's failure while Down, "ok" while Up.
	Cause string
	// Detail is the error text of the last failure while Down, for TXT (at most 200 bytes).
	Detail string
	// Last is the time of the last probe (before the View holding it was published: Views are
	// published on changes, not after every probe).
	Last time.Time
}

// Equal reports whether v and o are the same verdict, the time of the probe
// (Last) aside; without progress, WAL positions and the replicas' replay
// positions and lags aside too.
func (v Verdict) Equal(o Verdict, progress bool) bool {
	return v.State == o.State && v.Role == o.Role && v.Timeline == o.Timeline && v.SystemID == o.SystemID &&
		v.Leaving == o.Leaving && v.Cause == o.Cause && v.Detail == o.Detail &&
		v.ReplicasHidden == o.ReplicasHidden && (v.Replicas == nil) == (o.Replicas == nil) &&
		SameReplicas(v.Replicas, o.Replicas, progress) && (!progress || v.WAL == o.WAL)
}

// Config configures a Checker.
type Config struct {
	Check string // "tcp" or "postgres"
	// Options, for postgres: libpq key=value options without host/port ("user=monitor dbname=postgres
	// sslmode=prefer"); hostaddr and target_session_attrs are refused too. The host is the target's
	// IP address, so sslmode=verify-full needs certificates that name the IP address. Environment
	// variables (PGUSER, PGPASSWORD, PGPASSFILE...) and the passfile apply as in libpq.
	Options string
	// Source, when valid, is the local address probes are sent from (to
	// targets of its family); invalid: the system's choice.
	Source   netip.Addr
	Interval time.Duration // default 2s
	Timeout  time.Duration // default 1s
	Rise     int           // default 2
	Fall     int           // default 2
	// RoleInterval, for postgres: while this checker probes a node (and Shared, if set, allows a
	// session: see Sessions), it keeps one session open to it and reads the role and timeline on
	// it every RoleInterval, so that a promotion is seen within it and a server that shuts down,
	// or dies, leaves at once: when the session ends, the node is probed again at once, and a
	// refusal or a server saying it is going (SQLSTATE 57P01-57P03) takes it Down without waiting
	// for Fall probes. Interval keeps its meaning for connecting anew (liveness, authentication,
	// max_connections). Default 100ms; NoSessions keeps none open.
	RoleInterval time.Duration
	// ReportWAL: publish a new View when WAL positions moved (at most once per Interval), not only
	// on verdict transitions. pgcluster sets it when max_lag is configured.
	ReportWAL bool
	// Observe, if set, is called after every probe (for metrics): check type, result cause, duration.
	// It is called from the targets' goroutines, concurrently: it must be safe for concurrent use.
	Observe func(check, cause string, d time.Duration)
	// ObserveSession, if set, hears each session of RoleInterval opened (+1) and closed (-1), for
	// a gauge of the sessions open. Called concurrently, like Observe.
	ObserveSession func(delta int)
	// Shared, if set, shares the checking of the targets with other checkers (a fleet): it says
	// before each probe whether this checker probes the target, and hears every result.
	Shared Shared
	// ProbeBudget, if positive, bounds the probes this checker starts: at most ProbeBudget a
	// second, with bursts of 50 ms worth (at least one), so that a fleet whose instances all
	// start probing every target (Redis lost) multiplies its connections by the budget, not by
	// the targets. Each probe opens a connection; the sessions of RoleInterval and their polls
	// are not counted. A probe that finds the budget spent waits its turn: the probes due
	// longest ago go first, those of targets this checker probed at their last tick an Interval
	// ahead of the others, and a probe whose turn comes is not started if Shared no longer gives
	// the target to this checker. While the budget is short every target is still probed in
	// turn, about every targets/ProbeBudget seconds. 0: no budget. SetProbeBudget changes it.
	ProbeBudget float64
	// ObserveBudget, if set, hears each probe that waited for ProbeBudget before it started, and
	// how long it waited. Called concurrently, like Observe.
	ObserveBudget func(waited time.Duration)
}

// Progress is a target's verdict with the rise/fall counters that led to it, so that
// another checker can continue them where this one stopped.
type Progress struct {
	Verdict  Verdict
	OK, Fail int // consecutive successes, failures; each at most Rise, Fall
}

// Shared shares the checking of targets between checkers: each target is probed by one
// of them, which continues the rise/fall counters of the last one. Its methods are called
// from the targets' goroutines, concurrently.
type Shared interface {
	// Claim is asked before each probe of t. probe false skips the probe: another checker
	// probes t. When this checker starts probing t (the first probe, or the first after
	// skipped ones), its counters continue from seed; a zero seed keeps its own.
	Claim(t Target) (probe bool, seed Progress)
	// Record hears the progress of t after each probe this checker ran.
	Record(t Target, p Progress)
}

// Parking, when a Config.Shared implements it, lets a checker leave a target that Shared
// gives to another checker unasked until Shared says it may no longer be, rather than asking
// Claim again every Interval: a fleet instance is given about one target in members, and at
// 10,000 targets its Claims of the others were most of its steady work.
type Parking interface {
	// ClaimParked is Claim, and, when it says not to probe t, until when it will say so for
	// sure (zero: ask at the next tick as always), unless Shared calls the checker's Recheck
	// for t (or RecheckAll) before: then the checker asks again within an Interval, at t's
	// phase.
	ClaimParked(t Target) (probe bool, seed Progress, until time.Time)
}

// Sessions, when a Config.Shared implements it, says whether this checker may keep a session
// open to t (see Config.RoleInterval): a fleet keeps one per node, held by the instance that
// probes it for the fleet, and none while an instance checks everything itself. A Shared that
// does not implement it gets no sessions.
type Sessions interface {
	KeepSession(t Target) bool
}

// validate applies the defaults and checks every field; errors name the field.
func (cfg *Config) validate() error {
	switch cfg.Check {
	case CheckTCP:
		if cfg.Options != "" {
			return errors.New("health: Options are for the postgres check only: remove them or use Check \"postgres\"")
		}
	case CheckPostgres:
		if err := validateOptions(cfg.Options); err != nil {
			return err
		}
	default:
		return fmt.Errorf("health: Check %q is not a check: use %q or %q", cfg.Check, CheckTCP, CheckPostgres)
	}
	if err := defaultDuration(&cfg.Interval, DefaultInterval, "Interval"); err != nil {
		return err
	}
	if err := defaultDuration(&cfg.Timeout, DefaultTimeout, "Timeout"); err != nil {
		return err
	}
	if cfg.RoleInterval != NoSessions {
		if err := defaultDuration(&cfg.RoleInterval, DefaultRoleInterval, "RoleInterval"); err != nil {
			return err
		}
	}
	if err := defaultCount(&cfg.Rise, DefaultRise, "Rise"); err != nil {
		return err
	}
	if !(cfg.ProbeBudget >= 0) || math.IsInf(cfg.ProbeBudget, 1) {
		return fmt.Errorf("health: ProbeBudget %v is not a rate: give the probes a second at most, or 0 for no budget", cfg.ProbeBudget)
	}
	return defaultCount(&cfg.Fall, DefaultFall, "Fall")
}

func defaultDuration(d *time.Duration, def time.Duration, field string) error {
	switch {
	case *d == 0:
		*d = def
	case *d < 0:
		return fmt.Errorf("health: %s %v is negative: give a positive duration, or 0 for the default %v", field, *d, def)
	}
	return nil
}

func defaultCount(n *int, def int, field string) error {
	switch {
	case *n == 0:
		*n = def
	case *n < 0:
		return fmt.Errorf("health: %s %d is negative: give a count of 1 or more, or 0 for the default %d", field, *n, def)
	}
	return nil
}
