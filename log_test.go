package pgcluster

import (
	"io"
	"testing"

	clog "github.com/coredns/coredns/plugin/pkg/log"

	"github.com/pgcluster/pgcluster/internal/logtest"
)

func init() { clog.Discard() }

// captureLog returns what the plugin logs until the test ends.
func captureLog(t *testing.T) *logtest.Buffer { return logtest.Capture(t, io.Discard) }
