package lock

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/netip"
	"time"

	"github.com/pgcluster/pgcluster/health"
)

// status is what a lease holder stores and publishes about a target: the
// address it probed, who it is, when, and the verdict with its rise/fall
// counters.
type status struct {
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
	OK     int            `json:"ok"`
	Fail   int            `json:"fail"`
}

func newStatus(addr netip.AddrPort, holder string, at time.Time, p health.Progress) status {
	v := p.Verdict
	s := status{Addr: addr, Holder: holder, At: at.UnixMicro(), State: v.State.String(), Role: v.Role,
		WAL: v.WAL, TL: v.Timeline, Sys: v.SystemID, Gone: v.Leaving, Cause: v.Cause, Detail: v.Detail, OK: p.OK, Fail: p.Fail}
	if !v.Last.IsZero() {
		s.Last = v.Last.UnixMicro()
	}
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
	return health.Progress{Verdict: v, OK: s.OK, Fail: s.Fail}
}

// sigPrefix starts a signed status: "sig=<hex HMAC-SHA256> <json>".
const sigPrefix = "sig="

var (
	errUnsigned = errors.New("unsigned status")
	errBadSig   = errors.New("wrongly signed status")
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
// valid HMAC; without one, a signature is not checked.
func decode(key string, b []byte, secret []byte) (status, error) {
	var s status
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
		return s, err
	}
	if !s.Addr.IsValid() || s.Holder == "" || s.At <= 0 {
		return s, errors.New("status without address, holder or time")
	}
	switch s.State {
	case "up", "down", "unknown":
	default:
		return s, errors.New("status with state " + s.State)
	}
	return s, nil
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
// and the WAL position when lag is judged; with counters, the
// rise/fall counters too (so that a new holder continues from the last
// ones).
func sameVerdict(a, b health.Progress, wal, counters bool) bool {
	va, vb := a.Verdict, b.Verdict
	return va.State == vb.State && va.Role == vb.Role && va.Cause == vb.Cause &&
		va.Timeline == vb.Timeline && va.SystemID == vb.SystemID && va.Leaving == vb.Leaving &&
		(!wal || va.WAL == vb.WAL) && (!counters || a.OK == b.OK && a.Fail == b.Fail)
}
