package lock

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Bounds of what a registry copy read from Redis may hold. Whoever can
// write to Redis can write anything there: whatever is larger is refused
// before it is decoded, so that the work and memory one read costs stay
// bounded, and whatever names a time or version ahead of Redis's own
// clock is refused, so that no value written once, without the secret or
// by accident, can look newer than every genuine one for good.
const (
	// copyMaxHead bounds a head: a few hundred bytes and the registry's
	// name.
	copyMaxHead = 4 << 10
	// copyMaxRegistry bounds the registry's name in a head.
	copyMaxRegistry = 1 << 10
	// copyMaxField bounds one field (a cluster's rows, or every alias).
	copyMaxField = 16 << 20
	// copyMaxFields bounds the fields of a copy.
	copyMaxFields = 1 << 18
	// copyMaxBytes bounds a whole copy, as one read brings it.
	copyMaxBytes = 64 << 20
	// copyMaxName bounds a field's name.
	copyMaxName = 1 << 10
	// copyMaxEntry bounds a log entry: a reader that meets a longer one
	// reads the copy whole.
	copyMaxEntry = 4 << 20
	// copyMaxVersionText bounds a version as stored or published: the
	// digits of an int64.
	copyMaxVersionText = 19
)

// CopyVersionAhead is how far a copy's version may be ahead of Redis's
// clock, in seconds. A follower's versions count seconds (at least Redis's
// Unix time) and one more per write, so a follower that writes faster than
// once a second runs ahead of the clock: by a day only after 86,400 writes
// beyond one a second, which no registry makes. A version further ahead,
// such as 99999999999 or the largest int64, was not written by a
// follower: it is refused, and as a SOA serial (mod 2^32) it would jump
// and go backwards.
const CopyVersionAhead = 24 * 60 * 60

// MaxCopyVersion is the largest version a copy may have when Redis's
// clock reads now.
func MaxCopyVersion(now time.Time) int64 { return now.Unix() + CopyVersionAhead }

// errCopyBounds is a head or version outside the bounds above.
var errCopyBounds = errors.New("out of bounds")

// copyOutOfBounds is an errCopyBounds saying what.
func copyOutOfBounds(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errCopyBounds, fmt.Sprintf(format, args...))
}

// parseCopyVersion reads a version as stored or published: the decimal
// digits of a positive number, no sign, no leading zero, at most
// MaxCopyVersion(now).
func parseCopyVersion(raw string, now time.Time) (int64, error) {
	v, err := parseVersionText(raw)
	if err != nil {
		return 0, err
	}
	if max := MaxCopyVersion(now); v > max {
		return 0, copyOutOfBounds("version %d is ahead of Redis's clock (at most %d)", v, max)
	}
	return v, nil
}

// parseVersionText is parseCopyVersion without the clock.
func parseVersionText(raw string) (int64, error) {
	if len(raw) == 0 || len(raw) > copyMaxVersionText || raw[0] == '0' {
		return 0, copyOutOfBounds("version %q is not a positive number", clip(raw))
	}
	for i := range len(raw) {
		if raw[i] < '0' || raw[i] > '9' {
			return 0, copyOutOfBounds("version %q is not a positive number", clip(raw))
		}
	}
	v, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return 0, copyOutOfBounds("version %q: %v", clip(raw), err)
	}
	return v, nil
}

// ParseCopyVersion reads a version published on the copy's channel, as
// the copy's version is read, with Redis's clock reading now.
func ParseCopyVersion(raw string, now time.Time) (int64, error) { return parseCopyVersion(raw, now) }

// vetHead checks a decoded head against Redis's clock, now: its term and
// the time the follower vouched for it are at most a lease ahead, its
// version at most MaxCopyVersion, and every number in range.
func (c *RegistryCopy) vetHead(h CopyHead, now time.Time) error {
	ahead := now.Add(c.lease).UnixMicro()
	switch {
	case h.Term > ahead:
		return copyOutOfBounds("term %d is more than %v ahead of Redis's clock (%d)", h.Term, c.lease, now.UnixMicro())
	case h.Alive > ahead:
		return copyOutOfBounds("alive %d is more than %v ahead of Redis's clock (%d)", h.Alive, c.lease, now.UnixMicro())
	case h.Version > MaxCopyVersion(now):
		return copyOutOfBounds("version %d is ahead of Redis's clock (at most %d)", h.Version, MaxCopyVersion(now))
	case h.Alive < 0 || h.Seen < 0:
		return copyOutOfBounds("a time before 1970")
	case h.Prev < 0 || h.Prev >= h.Version:
		return copyOutOfBounds("version %d written over %d", h.Version, h.Prev)
	case h.Fields < 0 || h.Fields > copyMaxFields:
		return copyOutOfBounds("%d fields", h.Fields)
	case len(h.Registry) > copyMaxRegistry:
		return copyOutOfBounds("a registry name of %d bytes", len(h.Registry))
	}
	return nil
}

// VetHead decodes a head as DecodeHead does and checks it against Redis's
// clock, now (see CopyVersionAhead): what a head must pass before it
// counts.
func (c *RegistryCopy) VetHead(raw string, now time.Time) (CopyHead, error) {
	h, err := c.DecodeHead(raw)
	if err != nil {
		return h, err
	}
	return h, c.vetHead(h, now)
}

// clip is the start of a string read from Redis, for an error message:
// never more than a few bytes of whatever someone wrote.
func clip(s string) string {
	const n = 24
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
