package lock

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// status is what a lease holder stores and publishes about a target: the
// address it probed, who it is, when, and the verdict with its rise/fall
// counters.
type status struct {
	// V is the status's version, as stored and published with it: inside
	// the signature, so that a version cannot be changed or a status
	// replayed under another one without the secret.
	V      int64          `json:"v"`
	Addr   netip.AddrPort `json:"addr"`
	Holder string         `json:"holder"`
	At     int64          `json:"at"` // the holder's clock at the write, Unix µs
	State  string         `json:"state"`
	Role   string         `json:"role,omitempty"`
	WAL    uint64         `json:"wal,omitempty"`
	TL     uint32         `json:"tl,omitempty"`      // a primary's timeline
	Gone   bool           `json:"leaving,omitempty"` // the server ended the session: see health.Verdict.Leaving
	Sys    uint64         `json:"sys,omitempty"`     // the server's system identifier
	Cause  string         `json:"cause,omitempty"`
	Detail string         `json:"detail,omitempty"`
	Last   int64          `json:"last,omitempty"` // the probe's time, Unix µs
	// Seq numbers a published status among its holder's publishes (0: a
	// status rewritten without a publish, or by an instance that numbers
	// none): inside the signature, so that nobody without the secret can
	// make a reader believe it has heard what its holder published.
	Seq  uint64 `json:"seq,omitempty"`
	OK   int    `json:"ok"`
	Fail int    `json:"fail"`
	// Repl is a primary's standbys as it sees them (health.Verdict's
	// Replicas): null for a standby, [] for a primary without any, so
	// that a status without the field (an older instance's) is not
	// taken for a primary that has none. ReplHidden: the check's role
	// may not read them.
	Repl       []replicaStatus `json:"repl"`
	ReplHidden bool            `json:"repl_hidden,omitempty"`
}

// replicaStatus is a health.Replica in a status.
type replicaStatus struct {
	Name string `json:"n"`
	Addr string `json:"a,omitempty"`
	Sync string `json:"s"`
	LSN  uint64 `json:"l,omitempty"`
	Lag  int64  `json:"lag,omitempty"` // µs
}

// Bounds of a status's replicas: what a primary can show (application_name
// is at most 63 bytes), so that anyone's write stays small.
const (
	maxStatusReplicas = 64
	maxReplicaName    = 63
)

func newStatus(addr netip.AddrPort, holder string, at time.Time, p health.Progress) status {
	v := p.Verdict
	s := status{Addr: addr, Holder: holder, At: at.UnixMicro(), State: v.State.String(), Role: v.Role,
		WAL: v.WAL, TL: v.Timeline, Sys: v.SystemID, Gone: v.Leaving, Cause: v.Cause, Detail: v.Detail, OK: p.OK, Fail: p.Fail}
	if !v.Last.IsZero() {
		s.Last = v.Last.UnixMicro()
	}
	if v.Replicas != nil {
		s.Repl = make([]replicaStatus, 0, len(v.Replicas))
	}
	for _, r := range v.Replicas {
		rs := replicaStatus{Name: r.Name, Sync: r.Sync, LSN: r.ReplayLSN, Lag: r.Lag.Microseconds()}
		if r.Addr.IsValid() {
			rs.Addr = r.Addr.String()
		}
		s.Repl = append(s.Repl, rs)
	}
	s.ReplHidden = v.ReplicasHidden
	return s
}

// progress is the status as the health package's Progress.
func (s status) progress() health.Progress {
	v := health.Verdict{Role: s.Role, WAL: s.WAL, Timeline: s.TL, SystemID: s.Sys, Leaving: s.Gone, Cause: s.Cause, Detail: s.Detail}
	switch s.State {
	case "up":
		v.State = health.Up
	case "down":
		v.State = health.Down
	}
	if s.Last != 0 {
		v.Last = time.UnixMicro(s.Last)
	}
	if s.Repl != nil {
		v.Replicas = make([]health.Replica, 0, len(s.Repl))
	}
	for _, r := range s.Repl {
		addr, _ := netip.ParseAddr(r.Addr) // vetted: empty or an address
		v.Replicas = append(v.Replicas, health.Replica{Name: r.Name, Addr: addr, Sync: r.Sync, ReplayLSN: r.LSN, Lag: time.Duration(r.Lag) * time.Microsecond})
	}
	v.ReplicasHidden = s.ReplHidden
	return health.Progress{Verdict: v, OK: s.OK, Fail: s.Fail}
}

// behind reports whether s, a holder's status, is on its way down to the
// Down that own, this instance's own verdict on the target, has reached
// already: Up with failed probes since. Counted apart (in local mode every
// instance counts its own probes, and a holder that comes back writes its
// count), the two can disagree while the latest probes of both failed: a
// backend stopped during an outage, found Down here and Up with one failed
// probe by its holder. Answering the holder's then would bring back, for
// up to (fall - 1) intervals, a backend that neither saw answer. The
// holder's next probe decides: it reaches Down too, or it succeeded (and
// is the newest word on the target). Not the other way round: an Up of
// this instance's against a Down on its way up would answer with what this
// instance last read of the node (its role, say), older than the holder's
// probe, where waiting for rise is what a node coming back does anyway.
func (s status) behind(own health.Progress) bool {
	return own.Verdict.State == health.Down && s.State == "up" && s.Fail > 0
}

// sigPrefix starts a signed status: "sig=<hex HMAC-SHA256> <json>".
const sigPrefix = "sig="

// MaxStatusBytes bounds a status message and a stored status: one larger
// is refused before it is decoded. A status is a few hundred bytes; the
// bound keeps what anyone who can write to Redis makes an instance decode,
// hold or log small.
const MaxStatusBytes = 64 << 10

// Kinds of refusal of what is read from Redis: the rate-limited log has
// one line per kind per minute.
const (
	refusedLarge     = "too large"
	refusedMalformed = "malformed"
	refusedUnsigned  = "unsigned"
	refusedSignature = "wrongly signed"
	refusedVersion   = "version not the signed one"
	refusedAhead     = "ahead of Redis's clock"
)

// refusal is why something read from Redis does not count.
type refusal struct {
	kind string // one of the refused* kinds
	why  string // what a person reads; never more than a clip of the input
}

func (r *refusal) Error() string { return r.kind + ": " + r.why }

func refuse(kind, format string, args ...any) error {
	return &refusal{kind: kind, why: fmt.Sprintf(format, args...)}
}

// refusalKind is the kind of err, for the rate-limited log.
func refusalKind(err error) string {
	var r *refusal
	if errors.As(err, &r) {
		return r.kind
	}
	return refusedMalformed
}

var (
	errUnsigned = refuse(refusedUnsigned, "no signature, and redis_secret is set")
	errBadSig   = refuse(refusedSignature, "the signature is not the one the secret makes")
)

// encode writes s for key, signed with secret when there is one. The HMAC
// covers the key too, so that a status cannot be replayed under another.
func encode(key string, s status, secret []byte) []byte {
	j, _ := json.Marshal(s) // a struct of strings and numbers: cannot fail
	if len(secret) == 0 {
		return j
	}
	out := make([]byte, 0, len(sigPrefix)+64+1+len(j))
	out = append(out, sigPrefix...)
	out = hex.AppendEncode(out, mac(secret, key, j))
	out = append(out, ' ')
	return append(out, j...)
}

// decode reads a status of key. With a secret, a status must carry its
// valid HMAC; without one, a signature is not checked. It checks what a
// status must hold, not its bounds (see vetStatus).
func decode(key string, b []byte, secret []byte) (status, error) {
	var s status
	if len(b) > MaxStatusBytes {
		return s, refuse(refusedLarge, "%d bytes, over %d", len(b), MaxStatusBytes)
	}
	body := b
	if rest, ok := bytes.CutPrefix(b, []byte(sigPrefix)); ok {
		sig, j, ok := bytes.Cut(rest, []byte(" "))
		if !ok {
			return s, errBadSig
		}
		// Exactly as encode writes it (lowercase hex): one signed status
		// has one spelling, so a copy with any byte changed is refused.
		if len(secret) > 0 && !hmac.Equal(sig, hex.AppendEncode(nil, mac(secret, key, j))) {
			return s, errBadSig
		}
		body = j
	} else if len(secret) > 0 {
		return s, errUnsigned
	}
	if err := json.Unmarshal(body, &s); err != nil {
		return s, refuse(refusedMalformed, "unreadable JSON: %s", quoteRedis(err.Error()))
	}
	if !s.Addr.IsValid() || s.Holder == "" || s.At <= 0 || s.V <= 0 {
		return s, refuse(refusedMalformed, "no address, holder, time or version")
	}
	switch s.State {
	case "up", "down", "unknown":
	default:
		return s, refuse(refusedMalformed, "state %s", quoteRedis(s.State))
	}
	if err := vetReplicas(s.Repl); err != nil {
		return s, err
	}
	return s, nil
}

// vetReplicas refuses replicas no primary shows: too many, a name over
// application_name's length, an address that is not one (or
// not spelt as a holder writes it), an unknown sync state, a lag that is
// negative or beyond a time.Duration.
func vetReplicas(rs []replicaStatus) error {
	if len(rs) > maxStatusReplicas {
		return refuse(refusedMalformed, "%d replicas, over %d", len(rs), maxStatusReplicas)
	}
	for _, r := range rs {
		if len(r.Name) > maxReplicaName {
			return refuse(refusedMalformed, "replica name %s", quoteRedis(r.Name))
		}
		if r.Addr != "" {
			// As a holder writes it: one spelling per address.
			if a, err := netip.ParseAddr(r.Addr); err != nil || a.String() != r.Addr {
				return refuse(refusedMalformed, "replica address %s", quoteRedis(r.Addr))
			}
		}
		switch r.Sync {
		case health.ReplicaSync, health.ReplicaQuorum, health.ReplicaPotential, health.ReplicaAsync:
		default:
			return refuse(refusedMalformed, "replica sync state %s", quoteRedis(r.Sync))
		}
		if r.Lag < 0 || r.Lag > math.MaxInt64/int64(time.Microsecond) {
			return refuse(refusedMalformed, "replica lag %d µs", r.Lag)
		}
	}
	return nil
}

// vetStatus reads a status of key stored or published with version, as
// every reader of a fleet does before it counts: decoded as decode does,
// its signed version the one it came with, and neither that version nor
// its times more than ahead past now, Redis's clock (Unix µs) as the
// reader knows it. Versions are Redis's clock at the write, times the
// holder's: a fleet's clocks agree far better than a lease, so one
// further ahead is not a status any holder wrote, and counting it would
// make the real ones look stale until Redis's clock caught up.
func vetStatus(key string, version int64, b []byte, secret []byte, now int64, ahead time.Duration) (status, error) {
	st, err := decode(key, b, secret)
	if err != nil {
		return st, err
	}
	if st.V != version {
		return st, refuse(refusedVersion, "version %d, signed as %d", version, st.V)
	}
	limit := now + ahead.Microseconds()
	switch {
	case version > limit:
		return st, refuse(refusedAhead, "version %d is %v ahead of Redis's clock, over %v", version, aheadBy(version, now), ahead)
	case st.At > limit:
		return st, refuse(refusedAhead, "written at %d, %v ahead of Redis's clock, over %v", st.At, aheadBy(st.At, now), ahead)
	case st.Last > limit:
		return st, refuse(refusedAhead, "probed at %d, %v ahead of Redis's clock, over %v", st.Last, aheadBy(st.Last, now), ahead)
	}
	return st, nil
}

// aheadBy is how far the Unix µs t is past now, rounded for a log line.
func aheadBy(t, now int64) time.Duration {
	d := time.Duration(min(t-now, math.MaxInt64/1000)) * time.Microsecond
	return d.Round(time.Millisecond)
}

// quoteRedis quotes s for a log line, cut to a length a line can hold: what is
// read from Redis is anyone's, and is never logged whole.
func quoteRedis(s string) string {
	const most = 120
	if len(s) > most {
		return strconv.Quote(s[:most]) + fmt.Sprintf("... (%d bytes)", len(s))
	}
	return strconv.Quote(s)
}

func mac(secret []byte, key string, body []byte) []byte {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write(body)
	return h.Sum(nil)
}

// sameVerdict reports whether a and b make the same answers: state, role,
// timeline and system identifier (which primary wins a split brain), cause,
// a primary's standbys and which are synchronous, and, when lag is judged,
// the WAL position and the standbys' replay positions and lags; with
// counters, the rise/fall counters too (so that a new holder continues
// from the last ones).
func sameVerdict(a, b health.Progress, wal, counters bool) bool {
	va, vb := a.Verdict, b.Verdict
	return va.State == vb.State && va.Role == vb.Role && va.Cause == vb.Cause &&
		va.Timeline == vb.Timeline && va.SystemID == vb.SystemID && va.Leaving == vb.Leaving &&
		va.ReplicasHidden == vb.ReplicasHidden && (va.Replicas == nil) == (vb.Replicas == nil) &&
		health.SameReplicas(va.Replicas, vb.Replicas, wal) &&
		(!wal || va.WAL == vb.WAL) && (!counters || a.OK == b.OK && a.Fail == b.Fail)
}
