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

// FuzzStatusMessage reads arbitrary status messages as the Coordinator
// does: a published message (parseMessage: "<version> <key length>
// <key><status>") or, when it is not one, a status as stored (the hash's s
// field), decoded with and without a secret. Nothing may panic, and:
//   - a message that parses is read the same once written again in the
//     publish script's form;
//   - a status accepted with a secret is signed with exactly that secret
//     and key (lowercase hex of its HMAC, as encode writes it), and reads
//     the same without the secret; one without a signature is refused;
//   - an accepted status is one the Coordinator can apply (address,
//     holder, time, a known state), re-encodes to the same status signed
//     and unsigned, and its Progress makes it again;
//   - a signed status (the accepted one, or one made of the input's bytes)
//     with any one byte changed, cut short, or read under another key, is
//     refused.
//
// Seeds: a few below (signed and unsigned, stored and published) and
// testdata/fuzz/FuzzStatusMessage.
func FuzzStatusMessage(f *testing.F) {
	st := status{Addr: netip.MustParseAddrPort("192.0.2.1:5432"), Holder: "m1", At: 1_700_000_000_000_000,
		State: "down", Role: "primary", WAL: 1 << 40, Cause: "refused", Detail: "connection refused", Last: 1_700_000_000_000_001, OK: 0, Fail: 3}
	secret := []byte("0123456789abcdef-fleet")
	msg := func(v int64, key string, b []byte) []byte {
		return fmt.Appendf(nil, "%d %d %s%s", v, len(key), key, b)
	}
	up := status{Addr: netip.MustParseAddrPort("[2001:db8::1%eth0]:6432"), Holder: "h", At: 1, State: "up"}
	f.Add(msg(42, "c/a", encode("c/a", st, nil)), []byte(nil), uint16(0), byte(0))
	f.Add(msg(42, "c/a", encode("c/a", st, secret)), secret, uint16(7), byte(0x20))
	f.Add(msg(1, "prod/pg 1", encode("prod/pg 1", up, secret)), secret, uint16(200), byte(1))
	f.Add(encode("c/a", st, secret), secret, uint16(3), byte(0xff))
	f.Add(encode("c/a", up, nil), []byte("another-secret-16b"), uint16(9), byte(0x80))
	f.Add([]byte(`9 3 c/asig=zz {"addr":"192.0.2.1:1","holder":"x","at":1,"state":"up"}`), secret, uint16(0), byte(0))
	f.Add([]byte(`{"ADDR":"192.0.2.1:1","holder":"\ud800","at":1,"state":"unknown","last":-62135596800000000,"addr":"[::1]:2"}`), []byte(nil), uint16(0), byte(0))
	f.Fuzz(func(t *testing.T, payload, secret []byte, pos uint16, delta byte) {
		key, body := "c/a", payload
		if k, v, b, err := parseMessage(string(payload)); err == nil {
			key, body = k, b
			again := msg(v, k, b)
			k2, v2, b2, err := parseMessage(string(again))
			if err != nil || k2 != k || v2 != v || !bytes.Equal(b2, b) {
				t.Fatalf("message %q read as (%q, %d, %q), written again %q read as (%q, %d, %q, %v)", payload, k, v, b, again, k2, v2, b2, err)
			}
		}
		if delta == 0 {
			delta = 1
		}
		plain, plainErr := decode(key, body, nil)
		if plainErr == nil {
			checkStatus(t, key, plain, secret, int(pos), delta)
		}
		if len(secret) == 0 {
			return
		}
		signed, err := decode(key, body, secret)
		if err != nil {
			// Not accepted: sign a status made of the input's bytes, and
			// change it.
			made := status{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, delta}), pos), Holder: "h" + string(payload),
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

// checkStatus fails t unless s, accepted for key, can be applied and
// encodes again to itself, signed and not.
func checkStatus(t *testing.T, key string, s status, secret []byte, pos int, delta byte) {
	t.Helper()
	if !s.Addr.IsValid() || s.Holder == "" || s.At <= 0 {
		t.Fatalf("status accepted without address, holder or time: %+v", s)
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
	if again := newStatus(s.Addr, s.Holder, time.UnixMicro(s.At), p); !time.UnixMicro(s.Last).IsZero() && !reflect.DeepEqual(again, s) {
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
