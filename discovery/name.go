package discovery

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

const (
	// maxLabelLen is the longest label of a domain name (RFC 1035).
	maxLabelLen = 63
	// maxNameLen is the longest domain name in its text form without the
	// final dot (RFC 1035's 255 octets on the wire).
	maxNameLen = 253
)

// ErrBadName is wrapped by the errors of CheckName.
var ErrBadName = errors.New("discovery: bad name")

// CheckName reports what is wrong with name as a name to resolve: an IP
// address is fine; otherwise it must be a domain name whose labels have 1
// to 63 letters, digits, '-' or '_', 253 bytes at most in all (a final dot
// aside), with no port ("host:5432": the port goes elsewhere, such as
// Config.Port). Resolve, Discover and Watch refuse such names with this
// error before any query is sent.
func CheckName(name string) error {
	if _, err := netip.ParseAddr(name); err == nil {
		return nil
	}
	if host, port, err := net.SplitHostPort(name); err == nil {
		return fmt.Errorf("%w %q: it has a port (%s); give the name alone (%s) and the port separately", ErrBadName, name, port, host)
	}
	n := strings.TrimSuffix(name, ".")
	switch {
	case n == "":
		return fmt.Errorf("%w %q: empty", ErrBadName, name)
	case len(n) > maxNameLen:
		return fmt.Errorf("%w: %d bytes long, the most is %d: %q", ErrBadName, len(n), maxNameLen, clip(name))
	}
	for label := range strings.SplitSeq(n, ".") {
		switch {
		case label == "":
			return fmt.Errorf("%w %q: empty label (two dots in a row, or a leading dot)", ErrBadName, name)
		case len(label) > maxLabelLen:
			return fmt.Errorf("%w %q: label %q is %d bytes long, the most is %d", ErrBadName, clip(name), clip(label), len(label), maxLabelLen)
		}
		for _, r := range label {
			if !isLabelChar(r) {
				return fmt.Errorf("%w %q: character %q is not allowed in a label (letters, digits, '-' and '_')", ErrBadName, name, r)
			}
		}
	}
	return nil
}

func isLabelChar(r rune) bool {
	return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
}
