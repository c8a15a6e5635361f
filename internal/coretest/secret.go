package coretest

import (
	"crypto/rand"
	"encoding/hex"
)

// RandomHex returns n random bytes in hex: a password or secret a test
// makes up (crypto/rand.Read never fails; it crashes the program instead).
func RandomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
