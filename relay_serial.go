package pgcluster

// serialAfter reports whether SOA serial a comes after b in RFC 1982's
// serial arithmetic (mod 2^32): a - b is in (0, 2^31).
func serialAfter(a, b uint32) bool {
	d := a - b
	return d != 0 && d < 1<<31
}

// relaySerial is the SOA serial of a snapshot made of the fleet's
// registry version v (the relay), after prev (nil: the first): v itself
// whenever that does not go backwards from prev's serial (RFC 1982);
// otherwise prev's serial, or the next one when the zone changed (same is
// false). Whatever a copy says, then, the serial never goes backwards: a
// version below the one served (a new term after Redis lost the copy), or
// one 2^31 or more ahead (which RFC 1982 reads as behind), moves it by one
// at most. The relay refuses versions ahead of Redis's clock before they
// get here (lock.CopyVersionAhead), so a genuine version is a serial as
// it always was.
func relaySerial(prev *snapshot, v int64, same bool) uint32 {
	s := uint32(v)
	switch {
	case prev == nil || s == prev.serial || serialAfter(s, prev.serial):
		return s
	case same:
		return prev.serial
	}
	return prev.serial + 1
}
