// Package printable makes text that came from outside (a registry row, a
// value read from Redis) safe to show: in a TXT record, on an operator's
// terminal, in a log line.
package printable

// Cut returns s cut to max bytes, with every byte that is not printable
// ASCII, and the TXT escape characters \ and ", replaced by '?': no
// control character reaches a terminal, and a TXT string made from it
// always packs.
func Cut(s string, max int) string {
	b := []byte(s[:min(len(s), max)])
	for i, c := range b {
		if c < 0x20 || c > 0x7e || c == '\\' || c == '"' {
			b[i] = '?'
		}
	}
	return string(b)
}
