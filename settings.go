package pgcluster

import (
	"net/netip"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// settings is a parsed pgcluster block: every option, under one name each,
// shared (read-only once started) by the parser, the registry follower, the
// publisher and build.
type settings struct {
	zones         []string
	dsn           string
	ttl           uint32
	refresh       time.Duration
	staleAfter    time.Duration
	allowLoopback bool
	// self maps a node ("name" or "cluster/name") to the address to
	// advertise instead of its loopback one. As parsed, the invalid Addr
	// means "this host's outbound address"; start resolves it.
	self map[string]netip.Addr
	// nsAddrs are this instance's own addresses, for ns.<zone>; set at start.
	nsAddrs []netip.Addr
	// ns is the NS set of every zone, from the ns options, the SOA's MNAME
	// first; nil: ns.<zone> with nsAddrs. nsLabels are the names just below
	// a zone that its names inside a zone take (see reservedZoneLabel).
	ns       []nameServer
	nsLabels map[string]bool
	// soa is the SOA's timers; zero: the defaults (see soaTimers).
	soa soaTimers

	// topology: how a client's place orders or narrows its answers
	// (topologyOff, topologyPrefer, topologyLocal); minLocal: the serving
	// nodes a place needs for local to answer it alone.
	topology string
	minLocal int
	// location is where this instance runs (location); checkScope
	// whether the fleet (scopeFleet), each zone or each region keeps its
	// own verdicts (check_scope); passive: this instance never probes and
	// answers from the probing instances' statuses (check passive);
	// probeSource: the local address probes are sent from (probe_source),
	// invalid: the system's choice.
	location    place
	checkScope  string
	passive     bool
	probeSource netip.Addr

	// Active health checks: off while check is "".
	check        string // checkTCP or checkPostgres
	checkOptions string // libpq key=value options for checkPostgres
	interval     time.Duration
	timeout      time.Duration
	rise, fall   int
	maxLag       int64 // bytes; 0 is off
	// maxLagTime: max_lag as a duration, judged by replay_lag as the
	// primary reports it; 0 is off (max_lag takes bytes or a duration).
	maxLagTime time.Duration
	allDown    string
	// roleInterval: with check postgres, how often the session kept to a
	// node reads its role (health.NoSessions: none kept).
	roleInterval time.Duration
	// splitBrain: what primary. answers while two serving nodes claim to
	// be primary (splitBrainClosed, splitBrainNewestTimeline).
	splitBrain string
	// primaryHold: how long primary. keeps answering a primary that left
	// by its check while no other node is primary; 0 is off.
	primaryHold time.Duration
	// probeBudget: the probes a second this instance starts at most
	// (probe_budget); 0 is off, probeBudgetDefault the default (see
	// probeBudgetFor).
	probeBudget int

	// Redis, shared by a fleet: off while redisURL is "" (each instance
	// checks every node itself).
	redisURL    string // as given; parseRedisURL validated it
	redisPrefix string // of every key name; set whenever redisURL is
	redisSecret []byte // HMAC key of statuses and the registry copy; nil: unsigned
	// relayOff: with redis, every instance follows PostgreSQL itself
	// instead of one per fleet (relay.go).
	relayOff bool
	// relayGrace: a reader with rows to serve keeps serving them this long
	// (and up to as long again, at random) while Redis does not answer,
	// before it follows PostgreSQL itself; 0 follows at once.
	relayGrace time.Duration

	// instance is how this instance shows itself next to its tokens in
	// Redis: its host and DNS listener (instanceName); set at start.
	instance string
	// token names this instance in Redis, for its checks' coordinator
	// and its registry relay alike (one instance, one token); drawn at
	// start, "" without redis.
	token string
}

// Check types, and what to answer when every node of a name fails its check.
const (
	checkTCP      = health.CheckTCP
	checkPostgres = health.CheckPostgres

	allDownOpen   = "open"
	allDownClosed = "closed"

	// splitBrainClosed: no address for primary. while two serving nodes
	// claim to be primary. splitBrainNewestTimeline: of primaries made from
	// one initdb (one system identifier), the one on the newest timeline is
	// the primary, and the others are stale and answered nowhere.
	splitBrainClosed         = "closed"
	splitBrainNewestTimeline = "newest_timeline"
)

// Defaults and bounds of the check options.
const (
	defaultInterval = 2 * time.Second
	defaultTimeout  = time.Second
	defaultRise     = 2
	defaultFall     = 2
	// minInterval and minTimeout: below them a check is a load test of the
	// backends, and a timeout shorter than a loaded network's round trip.
	minInterval = 100 * time.Millisecond
	minTimeout  = 10 * time.Millisecond
	maxCount    = 100 // of rise and fall
	// defaultRoleInterval: a promotion is seen within it, for a query on
	// an open session that costs the server microseconds.
	defaultRoleInterval = health.DefaultRoleInterval
	minRoleInterval     = 10 * time.Millisecond
	// probeBudgetDefault: probe_budget not given. probeBudgetFloor: the
	// least default budget, a few hundred nodes' probes at the default
	// interval. maxProbeBudget bounds probe_budget.
	probeBudgetDefault = -1
	probeBudgetFloor   = 200
	maxProbeBudget     = 1_000_000
)

// checksOn reports whether nodes are actively checked.
func (s *settings) checksOn() bool { return s.check != "" }

// healthConfig is the checker's configuration; observe sees every probe.
func (s *settings) healthConfig(observe func(check, cause string, d time.Duration)) health.Config {
	return health.Config{
		Check:     s.check,
		Options:   s.checkOptions,
		Source:    s.probeSource,
		Interval:  s.interval,
		Timeout:   s.timeout,
		Rise:      s.rise,
		Fall:      s.fall,
		ReportWAL: s.judgesLag(),
		Observe:   observe,
		// 0 (tcp) is health's default, which tcp ignores.
		RoleInterval: s.roleInterval,
	}
}

// holdFor is how long primary. keeps a primary that left by its check while
// no other node is primary: primary_hold, or by default the time the checks
// would have taken to see it go without the session (fall probes, each up
// to an interval apart, the last one's timeout).
func (s *settings) holdFor() time.Duration {
	if s.primaryHold >= 0 {
		return s.primaryHold
	}
	return time.Duration(s.fall)*s.interval + s.timeout
}

// handoverFor is how long primary. answers a promoted primary while the
// primary it replaces still claims the role (see primary_hold.go): a role
// poll and its timeout, by when the old primary's session has ended or
// failed. 0 without sessions (the probes of interval would take seconds to
// see the old primary go: too long to answer past a split brain) and with
// split_brain newest_timeline (which answers the promoted one anyway).
func (s *settings) handoverFor() time.Duration {
	if s.check != checkPostgres || s.roleInterval == health.NoSessions || s.splitBrain != splitBrainClosed {
		return 0
	}
	ri := s.roleInterval
	if ri == 0 {
		ri = defaultRoleInterval
	}
	return ri + s.timeout
}

// resolveAddrs finds this host's outbound addresses: for ns.<zone>, and for
// the self options given without an address. A self option that finds none
// is dropped with a warning: its node's loopback address stays unadvertised.
func (s *settings) resolveAddrs() {
	v4, v6 := outboundAddrs()
	self := make(map[string]netip.Addr, len(s.self))
	for node, a := range s.self {
		if !a.IsValid() {
			if a = v4; !a.IsValid() {
				a = v6
			}
			if !a.IsValid() {
				log.Warningf("self %s: no outbound address found; its loopback address stays unadvertised", node)
				continue
			}
		}
		self[node] = a
	}
	s.self = self
	s.nsAddrs = nil
	for _, a := range []netip.Addr{v4, v6} {
		if a.IsValid() {
			s.nsAddrs = append(s.nsAddrs, a)
		}
	}
}

// judgesLag reports whether max_lag is on, in bytes or as a duration: WAL
// positions, and a primary's standbys' replay positions and lags, then
// change answers, and are published and compared.
func (s *settings) judgesLag() bool { return s.maxLag > 0 || s.maxLagTime > 0 }
