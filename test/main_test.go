package test

import (
	"os"
	"testing"
)

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	coreDNSBuild.Remove()
	pgclusterctlBuild.Remove()
	os.Exit(code)
}
