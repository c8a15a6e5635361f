package lock

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// copyFuzzNow is the Redis clock of the fuzz targets' seeds (µs).
const copyFuzzNow = int64(1_796_000_000_000_000)

// fuzzCopies are a copy with the secret and one without.
func fuzzCopies() []*RegistryCopy {
	return []*RegistryCopy{
		{secret: []byte(vetSecret), lease: copyTTL},
		{lease: copyTTL},
	}
}

// headInBounds checks, apart from VetHead, that h and raw are what a
// follower writes: within the bounds, by Redis's clock now, and (with a
// secret) signed, spelled exactly as encodeHead spells h.
func headInBounds(t *testing.T, c *RegistryCopy, raw string, h CopyHead, now time.Time) {
	t.Helper()
	ahead := now.Add(c.lease).UnixMicro()
	switch {
	case len(raw) > copyMaxHead:
		t.Errorf("accepted a head of %d bytes", len(raw))
	case h.Version <= 0 || h.Version > now.Unix()+CopyVersionAhead:
		t.Errorf("accepted version %d at %d", h.Version, now.Unix())
	case h.Term <= 0 || h.Term > ahead:
		t.Errorf("accepted term %d at %d", h.Term, now.UnixMicro())
	case h.Alive < 0 || h.Alive > ahead:
		t.Errorf("accepted alive %d at %d", h.Alive, now.UnixMicro())
	case h.Prev < 0 || h.Prev >= h.Version:
		t.Errorf("accepted version %d over %d", h.Version, h.Prev)
	case h.Fields < 0 || h.Fields > copyMaxFields || h.Seen < 0:
		t.Errorf("accepted %d fields, seen %d", h.Fields, h.Seen)
	case len(h.Registry) > copyMaxRegistry:
		t.Errorf("accepted a registry name of %d bytes", len(h.Registry))
	case len(h.Digest) != 64 || strings.Trim(h.Digest, "0123456789abcdef") != "":
		t.Errorf("accepted digest %q", h.Digest)
	}
	if len(c.secret) == 0 {
		return
	}
	sig, body, ok := strings.Cut(strings.TrimPrefix(raw, sigPrefix), " ")
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte(headKey + "\x00" + body))
	if !ok || !strings.HasPrefix(raw, sigPrefix) || sig != hex.EncodeToString(m.Sum(nil)) {
		t.Errorf("accepted a head not signed with the secret: %q", clip(raw))
	}
	if raw != c.encodeHead(h) {
		t.Errorf("accepted a head spelled otherwise than its signer writes it: %q", clip(raw))
	}
}

// FuzzRegistryCopyHead: a head is accepted only when it is within the
// bounds by Redis's clock and, with a secret, signed with it. Seeds are
// genuine heads, in and out of bounds; the fuzzer changes any byte and
// the clock.
//
//	go test -run '^$' -fuzz FuzzRegistryCopyHead ./lock/
func FuzzRegistryCopyHead(f *testing.F) {
	signed := fuzzCopies()[0]
	good := CopyHead{Term: copyFuzzNow - 1000, Version: copyFuzzNow / 1e6, Prev: copyFuzzNow/1e6 - 1, Digest: strings.Repeat("0a", 32),
		Fields: 3, Seen: copyFuzzNow - 500, Alive: copyFuzzNow - 100, Registry: "7312 postgres pgcluster.lan."}
	for _, h := range []CopyHead{
		good,
		headWith(good, func(h *CopyHead) { h.Term = copyFuzzNow + 10*copyTTL.Microseconds() }),
		headWith(good, func(h *CopyHead) { h.Alive = copyFuzzNow + 10*copyTTL.Microseconds() }),
		headWith(good, func(h *CopyHead) { h.Version = 9223372036854775807 }),
		headWith(good, func(h *CopyHead) { h.Version = 99999999999 }),
		headWith(good, func(h *CopyHead) { h.Prev = -1 }),
		headWith(good, func(h *CopyHead) { h.Fields = copyMaxFields + 1 }),
		headWith(good, func(h *CopyHead) { h.Registry = strings.Repeat("r", copyMaxRegistry+1) }),
	} {
		f.Add(signed.encodeHead(h), copyFuzzNow)
		f.Add((&RegistryCopy{}).encodeHead(h), copyFuzzNow)
	}
	f.Add("garbage", copyFuzzNow)
	f.Add(`{"term":1,"v":1,"digest":"`+strings.Repeat("A", 64)+`","n":0}`, copyFuzzNow)
	f.Fuzz(func(t *testing.T, raw string, nowMicro int64) {
		now := time.UnixMicro(nowMicro)
		for _, c := range fuzzCopies() {
			h, err := c.VetHead(raw, now)
			if err == nil {
				headInBounds(t, c, raw, h, now)
			}
		}
	})
}

// fuzzBase is the state a reader holds in FuzzRegistryCopyRead, the copy
// the follower wrote at version 100: fields a and b.
func fuzzBase(c *RegistryCopy) (*CopyState, map[string][]byte) {
	base := map[string][]byte{"a": []byte("1"), "b": []byte("2")}
	st := c.with(&CopyState{}, base, true)
	st.Term, st.Version, st.prev = copyFuzzNow-5000, copyFuzzNow/1e6-10, 0
	return st, base
}

// fuzzReply is a script's reply made of the fuzzer's strings: kind, the
// clock, then the rest split at NUL (a lone "\x01" is Lua's false, a
// field deleted).
func fuzzReply(kind string, now int64, rest string) []any {
	res := []any{kind, now}
	if rest == "" {
		return res
	}
	for _, s := range strings.Split(rest, "\x00") {
		if s == "\x01" {
			res = append(res, nil)
		} else {
			res = append(res, s)
		}
	}
	return res
}

// digestOf is, apart from CopyState, the digest of fields and how many.
func digestOf(c *RegistryCopy, fields map[string][]byte) (string, int) {
	var d [sha256.Size]byte
	n := 0
	for name, v := range fields {
		if v == nil {
			continue
		}
		xor(&d, c.element(name, v))
		n++
	}
	return hex.EncodeToString(d[:]), n
}

// FuzzRegistryCopyRead: what a read of the copy brings (a delta since the
// state held, or the whole copy) is accepted only with a head that
// FuzzRegistryCopyHead would accept and fields, within the bounds, that
// make the digest its head signs: a log or field written by anyone
// without the secret is never applied. Seeds are genuine replies.
//
//	go test -run '^$' -fuzz FuzzRegistryCopyRead ./lock/
func FuzzRegistryCopyRead(f *testing.F) {
	for _, c := range fuzzCopies() {
		st, base := fuzzBase(c)
		next := maps.Clone(base)
		next["b"], next["c"] = []byte("3"), []byte("4")
		delete(next, "a")
		n := c.with(st, map[string][]byte{"a": nil, "b": []byte("3"), "c": []byte("4")}, false)
		n.Term, n.Version, n.prev, n.alive = st.Term, st.Version+1, st.Version, copyFuzzNow-200
		head := c.encodeHead(n.head())
		v := strconv.FormatInt(n.Version, 10)
		f.Add("delta", copyFuzzNow, strings.Join([]string{v, head, "a", "\x01", "b", "3", "c", "4"}, "\x00"))
		f.Add("same", copyFuzzNow, strings.Join([]string{v, head}, "\x00"))
		var all []string
		for _, k := range slices.Sorted(maps.Keys(next)) {
			all = append(all, "f:"+k, string(next[k]))
		}
		f.Add("all", copyFuzzNow, strings.Join(append([]string{"v", v, "head", head}, all...), "\x00"))
		f.Add("all", copyFuzzNow, strings.Join(append([]string{"v", "99999999999", "head", head}, all...), "\x00"))
		f.Add("bad", copyFuzzNow, "a head of 5000000 bytes")
	}
	f.Fuzz(func(t *testing.T, kind string, nowMicro int64, rest string) {
		now := time.UnixMicro(nowMicro)
		res := fuzzReply(kind, nowMicro, rest)
		for _, c := range fuzzCopies() {
			st, base := fuzzBase(c)
			if rd, whole, err := c.decodeSince(st, res); err == nil && !whole {
				raw, _ := res[3].(string)
				headInBounds(t, c, raw, rd.Head, now)
				merged := maps.Clone(base)
				for k, v := range rd.Fields {
					merged[k] = v
					if len(v) > copyMaxField || len(k) > copyMaxName {
						t.Errorf("accepted a field %q of %d bytes", clip(k), len(v))
					}
				}
				if d, n := digestOf(c, merged); d != rd.Head.Digest || n != rd.Head.Fields || rd.State.Version != rd.Head.Version {
					t.Errorf("accepted a delta that does not make its head: %v", rd.Head)
				}
			}
			rd, err := c.decodeAll(&CopyState{}, res)
			if err != nil {
				continue
			}
			var raw string
			for i := 2; i+1 < len(res); i += 2 {
				if k, _ := res[i].(string); k == "head" {
					raw, _ = res[i+1].(string)
				}
			}
			headInBounds(t, c, raw, rd.Head, now)
			if d, n := digestOf(c, rd.Fields); d != rd.Head.Digest || n != rd.Head.Fields || len(rd.Fields) != n {
				t.Errorf("accepted a copy whose fields do not make its head: %v", rd.Head)
			}
			for k, v := range rd.Fields {
				if len(v) > copyMaxField || len(k) > copyMaxName {
					t.Errorf("accepted a field %q of %d bytes", clip(k), len(v))
				}
			}
		}
	})
}
