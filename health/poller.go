package health

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// poller speaks the PostgreSQL protocol itself on a session's connection,
// taken over from pgconn once pollStatement is prepared: a poll is one
// write of Bind, Execute and Sync, and one read of the reply; between polls
// a read waits until the next one is due, so that whatever the server sends
// meanwhile (an error as it shuts down, EOF as it dies) ends the wait at
// once. No timer, context or goroutine per poll: a fleet instance keeps
// hundreds of these sessions, each polled ten times a second.
type poller struct {
	conn    net.Conn
	fe      *pgproto3.Frontend
	timeout time.Duration
	request []byte // Bind, Execute, Sync of pollStatement
	closed  bool   // the connection ended: no more polls
	stopped atomic.Bool
}

func newPoller(conn net.Conn, timeout time.Duration) *poller {
	var req []byte
	req, _ = (&pgproto3.Bind{PreparedStatement: pollStatement}).Encode(req)
	req, _ = (&pgproto3.Execute{}).Encode(req)
	req, _ = (&pgproto3.Sync{}).Encode(req)
	return &poller{conn: conn, fe: pgproto3.NewFrontend(conn, conn), timeout: timeout, request: req}
}

// interrupt ends a wait or a poll in progress: the session is being closed.
func (p *poller) interrupt() {
	p.stopped.Store(true)
	p.conn.SetDeadline(time.Unix(1, 0))
}

// close says goodbye to the server and closes the connection.
func (p *poller) close() {
	if !p.closed {
		p.conn.SetWriteDeadline(time.Now().Add(p.timeout))
		term, _ := (&pgproto3.Terminate{}).Encode(nil)
		p.conn.Write(term)
	}
	p.conn.Close()
}

// listen waits until deadline: nil when the server said nothing that ends
// the session meanwhile, the error that ended it otherwise.
func (p *poller) listen(deadline time.Time) error {
	if p.stopped.Load() {
		return errSessionClosed
	}
	if err := p.conn.SetReadDeadline(deadline); err != nil {
		return p.fail(err)
	}
	for {
		msg, err := p.fe.Receive()
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && !p.stopped.Load() {
				return nil // time to poll
			}
			return p.fail(err)
		}
		if e, ok := msg.(*pgproto3.ErrorResponse); ok {
			return p.fail(pgconn.ErrorResponseToPgError(e))
		}
		// A notice, a parameter status or a notification: nothing to act on.
	}
}

// poll sends pollStatement and reads its reply within the timeout.
func (p *poller) poll() (result, error) {
	if p.stopped.Load() {
		return result{}, errSessionClosed
	}
	deadline := time.Now().Add(p.timeout)
	p.conn.SetDeadline(deadline)
	if _, err := p.conn.Write(p.request); err != nil {
		return result{}, p.fail(err)
	}
	var (
		res     result
		rows    int
		failure error
	)
	for {
		msg, err := p.fe.Receive()
		if err != nil {
			return result{}, p.fail(err)
		}
		switch m := msg.(type) {
		case *pgproto3.DataRow:
			rows++
			if rows == 1 {
				res, failure = parsePoll(m.Values)
			}
		case *pgproto3.ErrorResponse:
			failure = pgconn.ErrorResponseToPgError(m)
			if m.Severity == "FATAL" {
				return result{}, p.fail(failure)
			}
		case *pgproto3.ReadyForQuery:
			switch {
			case failure != nil:
				return result{}, failure
			case rows != 1:
				return result{}, fmt.Errorf("the role poll returned %d rows, not one", rows)
			}
			return res, nil
		}
	}
}

// fail marks the connection ended when err ends it, and returns err: any
// error but a deadline passed, and a deadline passed during a poll's reply
// too (its bytes may be half read).
func (p *poller) fail(err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Severity == "FATAL" || pgErr.Severity == "PANIC" {
		p.closed = true
	}
	if errors.Is(err, io.ErrUnexpectedEOF) {
		err = io.EOF
	}
	return err
}

// errSessionClosed: the session was closed by this checker.
var errSessionClosed = errors.New("session closed")

// parsePoll reads pollQuery's one row.
func parsePoll(values [][]byte) (result, error) {
	if len(values) != 2 {
		return result{}, errors.New("the role poll did not return two columns")
	}
	role, err := parseRole(values[0])
	if err != nil {
		return result{}, err
	}
	tl, err := strconv.ParseInt(string(values[1]), 10, 64)
	if err != nil || tl < 0 || tl > 1<<32-1 {
		return result{}, fmt.Errorf("timeline %q is not a 32-bit number", values[1])
	}
	return result{cause: CauseOK, role: role, tl: uint32(tl)}, nil
}
