package discovery

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// sslRequestCode is the SSLRequest message code (protocol 1234.5679).
const sslRequestCode = 80877103

// Prober measures how long a candidate takes to answer. Probe returns an
// error when the candidate does not answer, or gives a wrong answer, before
// ctx ends.
type Prober interface {
	Probe(ctx context.Context, addr netip.AddrPort) (time.Duration, error)
}

// ProbeFunc adapts a function to the Prober interface.
type ProbeFunc func(ctx context.Context, addr netip.AddrPort) (time.Duration, error)

// Probe calls f.
func (f ProbeFunc) Probe(ctx context.Context, addr netip.AddrPort) (time.Duration, error) {
	return f(ctx, addr)
}

var (
	// TCPProbe measures the time to open a TCP connection, then closes it
	// without sending anything.
	TCPProbe = ProbeFunc(probeTCP)
	// PostgresProbe opens a TCP connection, sends an SSLRequest and measures
	// the time until the server's one-byte reply ('S' or 'N'), by the
	// kernel's receive timestamp on Linux so that a busy client does not
	// skew it. It needs no credentials and proves a PostgreSQL postmaster is
	// answering, not just a socket accepting. A server that replies 'S'
	// expects a TLS handshake next and may log that the client went away.
	PostgresProbe = ProbeFunc(probePostgres)
)

// ParseProbe returns the Prober called name: "tcp" or "postgres".
func ParseProbe(name string) (Prober, error) {
	switch name {
	case "tcp":
		return TCPProbe, nil
	case "postgres", "":
		return PostgresProbe, nil
	}
	return nil, fmt.Errorf("discovery: unknown probe %q (want tcp or postgres)", name)
}

func probeTCP(ctx context.Context, addr netip.AddrPort) (time.Duration, error) {
	start := time.Now()
	conn, err := dial(ctx, addr, nil)
	if err != nil {
		return 0, err
	}
	d := time.Since(start)
	conn.Close()
	return d, nil
}

func probePostgres(ctx context.Context, addr netip.AddrPort) (time.Duration, error) {
	conn, err := dial(ctx, addr, stampControl)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	var req [8]byte
	binary.BigEndian.PutUint32(req[0:4], 8)
	binary.BigEndian.PutUint32(req[4:8], sslRequestCode)
	sent := time.Now()
	if _, err := conn.Write(req[:]); err != nil {
		return 0, probeErr(ctx, err)
	}
	var reply [1]byte
	at, err := readStamped(conn, reply[:])
	if err != nil {
		return 0, probeErr(ctx, err)
	}
	if reply[0] != 'S' && reply[0] != 'N' {
		return 0, fmt.Errorf("not PostgreSQL: reply %q to SSLRequest", reply[0])
	}
	return max(at.Sub(sent), time.Nanosecond), nil
}

// dial opens a TCP connection to addr within ctx; control, when not nil,
// sets socket options before it connects.
func dial(ctx context.Context, addr netip.AddrPort, control func(string, string, syscall.RawConn) error) (net.Conn, error) {
	d := net.Dialer{Control: control}
	conn, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return nil, probeErr(ctx, err)
	}
	return conn, nil
}

// readPlain reads into b (at least one byte) and returns when it did.
func readPlain(conn net.Conn, b []byte) (time.Time, error) {
	if _, err := io.ReadAtLeast(conn, b, 1); err != nil {
		return time.Time{}, err
	}
	return time.Now(), nil
}

// probeErr reports a probe cut short by its context as a timeout, which is
// what it is to the caller.
func probeErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("no answer: %w", context.Cause(ctx))
	}
	if op, ok := errors.AsType[*net.OpError](err); ok {
		return op.Err // the caller knows the address
	}
	return err
}
