package lock

import "strings"

// Key names. A key's lease and status share the hash tag "{key}" so that the
// fenced publish script, which touches both, works on Redis Cluster too: the
// variable suffix comes after the tag, so whatever the prefix or the key
// contains, both names hash to the same slot.
const (
	leaseSuffix  = ":lease"
	statusSuffix = ":status"
	channelName  = "statuses"
)

func leaseKey(prefix, key string) string  { return prefix + "{" + key + "}" + leaseSuffix }
func statusKey(prefix, key string) string { return prefix + "{" + key + "}" + statusSuffix }

// watermarksKey names the hash of the members' watermarks under prefix
// (see Membership.Watermarks): under the prefix, and hash-tagged with the
// members key's whole name (which has no tag: a prefix has no braces), so
// that the heartbeat script, which touches both, works on Redis Cluster
// too.
func watermarksKey(prefix string) string {
	return prefix + "{" + membersKey(prefix) + "}watermarks"
}

// namesKey names the hash of the members' names (each one's host and DNS
// listener, for tools to show beside its token), hash-tagged as
// watermarksKey is.
func namesKey(prefix string) string {
	return prefix + "{" + membersKey(prefix) + "}names"
}

// channel is the Pub/Sub channel statuses under prefix are published on.
func channel(prefix string) string { return prefix + channelName }

// statusPattern matches every status key under prefix (SCAN MATCH syntax).
func statusPattern(prefix string) string {
	return globEscape(prefix) + "{*}" + globEscape(statusSuffix)
}

// keyOfStatus returns the key a status key name belongs to.
func keyOfStatus(prefix, name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, prefix+"{")
	if !ok {
		return "", false
	}
	rest, ok = strings.CutSuffix(rest, "}"+statusSuffix)
	return rest, ok
}

// globEscape quotes the characters SCAN MATCH treats specially.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}
