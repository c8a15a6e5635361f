package discovery

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestClassify(t *testing.T) {
	primary := netip.MustParseAddrPort("127.0.0.2:5432")
	other := netip.MustParseAddrPort("127.0.0.3:5432")
	refused := func(a netip.AddrPort) error {
		return &net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(a), Err: errConnRefusedForTest.Err}
	}
	writer := &Watcher{writer: true}
	writer.view.Store(&view{})
	reader := &Watcher{}
	reader.view.Store(&view{primary: Answer{Candidates: []Candidate{{Addr: primary}}}})
	tests := []struct {
		name       string
		err        error
		switchover bool
		stale      bool
	}{
		{name: "57P01", err: &pgconn.PgError{Code: "57P01"}, switchover: true, stale: true},
		{name: "57P02 wrapped", err: fmt.Errorf("query: %w", &pgconn.PgError{Code: "57P02"}), switchover: true, stale: true},
		{name: "57P03 among hosts", err: errors.Join(io.EOF, &pgconn.PgError{Code: "57P03"}), switchover: true, stale: true},
		{name: "25006", err: &pgconn.PgError{Code: "25006"}, switchover: true, stale: true},
		{name: "refused", err: refused(other), switchover: true},
		{name: "reset", err: fmt.Errorf("read: %w", errConnResetForTest), switchover: true},
		{name: "EOF", err: fmt.Errorf("receive message: %w", io.ErrUnexpectedEOF), switchover: true},
		{name: "pooled connection lost", err: &connLost{addr: other}, switchover: true},
		{name: "read-only check", err: fmt.Errorf("validate: %w", pgconn.ErrReadOnlyConnection), switchover: true},
		{name: "unique violation", err: &pgconn.PgError{Code: "23505"}},
		{name: "some error", err: errors.New("connection refused")},
	}
	for _, tc := range tests {
		if got := writer.classify(tc.err); got != (errorKind{tc.switchover, tc.stale}) {
			t.Errorf("primary.CLUSTER, %s: %+v, want switchover %v stale %v", tc.name, got, tc.switchover, tc.stale)
		}
	}
	// A Watcher of CLUSTER: connection errors count only about the primary.
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"refused by the primary", refused(primary), true},
		{"refused by another node", refused(other), false},
		{"the primary's pooled connection lost", &connLost{addr: primary}, true},
		{"57P01 from any node", &pgconn.PgError{Code: "57P01"}, true},
		{"EOF from nobody knows where", io.EOF, false},
	} {
		if got := reader.classify(tc.err).switchover; got != tc.want {
			t.Errorf("CLUSTER, %s: switchover %v, want %v", tc.name, got, tc.want)
		}
	}
}

// An error not of a switchover keeps MinInterval: a connection refused by
// a standby, reported to a Watcher of the whole cluster.
func TestOtherErrorsKeepMinInterval(t *testing.T) {
	c := newCluster(t, 0, 0)
	c.dns.SetTTL(3600)
	w, _ := watch(t, c.client(t, Config{}), "local.pgcluster.lan", WatchOptions{Interval: time.Hour, MinInterval: time.Second})
	before, reported := w.resolutions(), time.Now()
	standby := c.nodes[1].Addr
	w.ReportError(&net.OpError{Op: "dial", Net: "tcp", Addr: net.TCPAddrFromAddrPort(standby), Err: errConnRefusedForTest.Err})
	waitFor(t, 10*time.Second, "the resolution the error asked for", func() bool { return w.resolutions() > before })
	took := time.Since(reported)
	t.Logf("a standby's refusal: resolved %s later (MinInterval 1s since the first resolution)", took.Round(time.Millisecond))
	if took < time.Second/2 {
		t.Errorf("resolved %s after an error not of a switchover, want MinInterval to hold it back", took)
	}
}
