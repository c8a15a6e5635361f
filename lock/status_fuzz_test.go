package lock

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"
)

// fuzzNow and fuzzAhead are Redis's clock and the bound the fuzz target
// vets statuses by.
const (
	fuzzNow   = int64(1_700_000_000_000_000)
	fuzzAhead = time.Second
)

// FuzzStatusMessage reads arbitrary status messages as the Coordinator
// does: a published message (parseMessage: "<version> <key length>
// <key><status>") or, when it is not one, a status as stored (the hash's s
// field, with the version its body claims as the hash's v), decoded and
// vetted with and without a secret. Nothing may panic, and:
//   - a message that parses is read the same once written again in the
//     publish script's form, and is within maxMessage;
//   - a status vetted with a secret is signed with exactly that secret
//     and key (lowercase hex of its HMAC, as encode writes it), and reads
//     the same without the secret; one without a signature is refused;
//   - a status vetted, with a secret or not, is within MaxStatusBytes,
//     carries as its signed version the one it came with, and neither
//     that version nor its write and probe times are more than the bound
//     past Redis's clock; the same status with another version, or with
//     its version or a time past the bound, is refused;
//   - an accepted status is one the Coordinator can apply (address,
//     holder, time, version, a known state), re-encodes to the same status
//     signed and unsigned, and its Progress makes it again;
//   - a signed status (the accepted one, or one made of the input's bytes)
//     with any one byte changed, cut short, or read under another key, is
//     refused.
//
// Seeds: a few below (signed and unsigned, stored and published, in and
// out of bounds) and testdata/fuzz/FuzzStatusMessage.
func FuzzStatusMessage(f *testing.F) {
	st := status{V: fuzzNow - 5, Addr: netip.MustParseAddrPort("192.0.2.1:5432"), Holder: "m1", At: fuzzNow - 7,
		State: "down", Role: "primary", WAL: 1 << 40, Cause: "refused", Detail: "connection refused", Last: fuzzNow - 9, OK: 0, Fail: 3}
	secret := []byte("0123456789abcdef-fleet")
	msg := func(v int64, key string, b []byte) []byte {
		return fmt.Appendf(nil, "%d %d %s%s", v, len(key), key, b)
	}
	up := status{V: 42, Addr: netip.MustParseAddrPort("[2001:db8::1%eth0]:6432"), Holder: "h", At: 1, State: "up"}
	ahead := st
	ahead.V = fuzzNow + 2*fuzzAhead.Microseconds()
	late := st
	late.At = 1 << 62
	f.Add(msg(st.V, "c/a", encode("c/a", st, nil)), []byte(nil), uint16(0), byte(0))
	f.Add(msg(st.V, "c/a", encode("c/a", st, secret)), secret, uint16(7), byte(0x20))
	f.Add(msg(42, "prod/pg 1", encode("prod/pg 1", up, secret)), secret, uint16(200), byte(1))
	f.Add(msg(43, "prod/pg 1", encode("prod/pg 1", up, secret)), secret, uint16(200), byte(1))
	f.Add(msg(ahead.V, "c/a", encode("c/a", ahead, secret)), secret, uint16(1), byte(2))
	withStandbys := st
	withStandbys.State, withStandbys.Repl = "up", []replicaStatus{{Name: "pg2", Addr: "127.0.0.1", Sync: "sync", LSN: 1 << 30, Lag: 1500}, {Name: "pg3", Sync: "async"}}
	f.Add(msg(st.V, "c/a", encode("c/a", withStandbys, secret)), secret, uint16(30), byte(4))
	withStandbys.Repl = []replicaStatus{}
	f.Add(msg(st.V, "c/a", encode("c/a", withStandbys, nil)), []byte(nil), uint16(3), byte(8))
	f.Add(msg(late.V, "c/a", encode("c/a", late, nil)), []byte(nil), uint16(1), byte(2))
	f.Add(encode("c/a", st, secret), secret, uint16(3), byte(0xff))
	f.Add(encode("c/a", up, nil), []byte("another-secret-16b"), uint16(9), byte(0x80))
	f.Add([]byte(`9 3 c/asig=zz {"v":9,"addr":"192.0.2.1:1","holder":"x","at":1,"state":"up"}`), secret, uint16(0), byte(0))
	f.Add([]byte(`9223372036854775807 3 c/a{"v":9223372036854775807,"addr":"192.0.2.1:1","holder":"x","at":1,"state":"up"}`), []byte(nil), uint16(0), byte(0))
	f.Add([]byte(`{"ADDR":"192.0.2.1:1","holder":"\ud800","at":1,"v":1,"state":"unknown","last":-62135596800000000,"addr":"[::1]:2"}`), []byte(nil), uint16(0), byte(0))
	f.Fuzz(func(t *testing.T, payload, secret []byte, pos uint16, delta byte) {
		key, body, version := "c/a", payload, int64(0)
		if k, v, b, err := parseMessage(string(payload)); err == nil {
			key, body, version = k, b, v
			if len(payload) > maxMessage {
				t.Fatalf("a message of %d bytes parsed, over %d", len(payload), maxMessage)
			}
			again := msg(v, k, b)
			k2, v2, b2, err := parseMessage(string(again))
			if err != nil || k2 != k || v2 != v || !bytes.Equal(b2, b) {
				t.Fatalf("message %q read as (%q, %d, %q), written again %q read as (%q, %d, %q, %v)", payload, k, v, b, again, k2, v2, b2, err)
			}
		} else if s, err := decode(key, body, nil); err == nil {
			version = s.V // a stored status: the hash's v as its writer stored it
		}
		if delta == 0 {
			delta = 1
		}
		plain, plainErr := decode(key, body, nil)
		if plainErr == nil {
			checkStatus(t, key, plain, secret, int(pos), delta)
		}
		for _, sec := range [][]byte{nil, secret} {
			if vetted, err := vetStatus(key, version, body, sec, fuzzNow, fuzzAhead); err == nil {
				checkBounds(t, key, version, body, vetted, sec)
			}
		}
		if len(secret) == 0 {
			return
		}
		signed, err := decode(key, body, secret)
		if err != nil {
			// Not accepted: sign a status made of the input's bytes, and
			// change it.
			made := status{V: int64(pos) + 1, Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, delta}), pos), Holder: "h" + string(payload),
				At: int64(pos) + 1, State: "up", Detail: string(secret), Fail: int(delta)}
			checkSigned(t, key, made, secret, int(pos), delta)
			return
		}
		if !bytes.HasPrefix(body, []byte(sigPrefix)) {
			t.Fatalf("an unsigned status accepted with a secret: %q", body)
		}
		sig, j, _ := bytes.Cut(body, []byte(" "))
		if want := append([]byte(sigPrefix), hex.EncodeToString(mac(secret, key, j))...); !bytes.Equal(sig, want) {
			t.Fatalf("status %q accepted with signature %q, want %q", body, sig, want)
		}
		if plainErr != nil || !reflect.DeepEqual(plain, signed) {
			t.Fatalf("a signed status read as %+v with its secret, %+v (%v) without", signed, plain, plainErr)
		}
	})
}

// checkBounds fails t unless st, vetted for key with version from body
// (with secret, when set), is within every bound, signed when there is a
// secret, and refused once moved out of any of them.
func checkBounds(t *testing.T, key string, version int64, body []byte, st status, secret []byte) {
	t.Helper()
	limit := fuzzNow + fuzzAhead.Microseconds()
	switch {
	case len(body) > MaxStatusBytes:
		t.Fatalf("a status of %d bytes vetted, over %d", len(body), MaxStatusBytes)
	case len(secret) > 0 && !bytes.HasPrefix(body, []byte(sigPrefix)):
		t.Fatalf("an unsigned status vetted with a secret: %q", body)
	case st.V != version:
		t.Fatalf("status %q vetted with version %d, signed as %d", body, version, st.V)
	case version > limit || st.At > limit || st.Last > limit:
		t.Fatalf("status %q vetted with version %d, written at %d, probed at %d: past Redis's clock %d plus %v", body, version, st.At, st.Last, fuzzNow, fuzzAhead)
	}
	if _, err := vetStatus(key, version+1, body, secret, fuzzNow, fuzzAhead); err == nil {
		t.Fatalf("status %q signed as version %d vetted with version %d", body, version, version+1)
	}
	sec := secret
	if len(sec) == 0 {
		sec = nil
	}
	for _, out := range []func(*status){
		func(s *status) { s.V = limit + 1 },
		func(s *status) { s.At = limit + 1 },
		func(s *status) { s.Last = limit + 1 },
	} {
		moved := st
		out(&moved)
		if got, err := vetStatus(key, moved.V, encode(key, moved, sec), sec, fuzzNow, fuzzAhead); err == nil {
			t.Fatalf("status %+v past Redis's clock %d plus %v vetted: %+v", moved, fuzzNow, fuzzAhead, got)
		}
	}
}

// checkStatus fails t unless s, accepted for key, can be applied and
// encodes again to itself, signed and not.
func checkStatus(t *testing.T, key string, s status, secret []byte, pos int, delta byte) {
	t.Helper()
	if !s.Addr.IsValid() || s.Holder == "" || s.At <= 0 || s.V <= 0 {
		t.Fatalf("status accepted without address, holder, time or version: %+v", s)
	}
	switch s.State {
	case "up", "down", "unknown":
	default:
		t.Fatalf("status accepted with state %q", s.State)
	}
	// As the Coordinator's own statuses are made: from a Progress. A Last
	// at Go's zero time means "never probed" there, and is written as 0.
	p := s.progress()
	if p.Verdict.State.String() != s.State {
		t.Fatalf("state %q read as %v", s.State, p.Verdict.State)
	}
	again := newStatus(s.Addr, s.Holder, time.UnixMicro(s.At), p)
	again.V = s.V // set at the write
	if !time.UnixMicro(s.Last).IsZero() && !reflect.DeepEqual(again, s) {
		t.Fatalf("status %+v made again from its Progress as %+v", s, again)
	}
	if again, err := decode(key, encode(key, s, nil), nil); err != nil || !reflect.DeepEqual(again, s) {
		t.Fatalf("status %+v encoded and decoded again: %+v, %v", s, again, err)
	}
	if len(secret) == 0 {
		secret = []byte("a-secret-of-16-b")
	}
	checkSigned(t, key, s, secret, pos, delta)
}

// checkSigned fails t unless s signed for key with secret reads back as
// itself, and refuses it changed.
func checkSigned(t *testing.T, key string, s status, secret []byte, pos int, delta byte) {
	t.Helper()
	b := encode(key, s, secret)
	want, err := decode(key, encode(key, s, nil), nil)
	if err != nil {
		return // not a status the Coordinator would write (no holder, ...)
	}
	if got, err := decode(key, b, secret); err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("status %+v signed and decoded: %+v, %v", want, got, err)
	}
	if k, v, body, err := parseMessage(string(fmt.Appendf(nil, "%d %d %s%s", pos+1, len(key), key, b))); err != nil || k != key || v != int64(pos+1) || !bytes.Equal(body, b) {
		t.Fatalf("message of %q, version %d, %q: read as %q, %d, %q, %v", key, pos+1, b, k, v, body, err)
	}
	i := pos % len(b)
	changed := bytes.Clone(b)
	changed[i] ^= delta
	if got, err := decode(key, changed, secret); err == nil {
		t.Fatalf("signed status %q with byte %d changed (%q to %q) accepted: %+v", b, i, b[i], changed[i], got)
	}
	if got, err := decode(key, b[:i], secret); err == nil {
		t.Fatalf("signed status %q cut to %d bytes accepted: %+v", b, i, got)
	}
	other := key + "x"
	if len(key) > 0 {
		k := []byte(key)
		k[pos%len(k)] ^= delta
		other = string(k)
	}
	if got, err := decode(other, b, secret); err == nil {
		t.Fatalf("status signed for %q accepted for %q: %+v", key, other, got)
	}
	// Another secret (not secret with zeros after it: HMAC pads a short
	// key with zeros, so that one is the same key).
	wrong := bytes.Clone(secret)
	wrong[pos%len(wrong)] ^= delta
	if got, err := decode(key, b, wrong); err == nil {
		t.Fatalf("status signed with %q accepted with %q: %+v", secret, wrong, got)
	}
}
