package discoverytest

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
)

const (
	sslRequestCode = 80877103
	gssRequestCode = 80877104
)

// Postgres stands in for a PostgreSQL server: it answers an SSLRequest with
// 'N' (or the byte set with SetReply), and a startup message with a FATAL
// error 3D000 ("database does not exist"), which stops a client from trying
// other hosts. It counts what it received.
type Postgres struct {
	// Addr is where it listens.
	Addr netip.AddrPort

	srv      *tcpServer
	reply    atomic.Int32
	accepted atomic.Int64
	startups atomic.Int64
}

// NewPostgres starts a Postgres on 127.0.0.1 and a free port. It is stopped
// when the test ends.
func NewPostgres(tb TB) *Postgres {
	tb.Helper()
	return ServePostgres(tb, Listen(tb, "127.0.0.1:0"))
}

// ServePostgres serves a Postgres on ln. It is stopped when the test ends.
func ServePostgres(tb TB, ln net.Listener) *Postgres {
	p := &Postgres{Addr: addrOf(ln)}
	p.reply.Store('N')
	p.srv = startTCP(ln, p.handle)
	tb.Cleanup(p.Close)
	return p
}

// SetReply sets the byte sent in reply to an SSLRequest.
func (p *Postgres) SetReply(b byte) { p.reply.Store(int32(b)) }

// Accepted returns how many connections it accepted.
func (p *Postgres) Accepted() int64 { return p.accepted.Load() }

// Startups returns how many startup messages it received: connection
// attempts, as opposed to probes.
func (p *Postgres) Startups() int64 { return p.startups.Load() }

// Close stops it and closes its connections.
func (p *Postgres) Close() { p.srv.close() }

func (p *Postgres) handle(c net.Conn) {
	p.accepted.Add(1)
	for {
		var head [8]byte
		if _, err := io.ReadFull(c, head[:]); err != nil {
			return
		}
		switch binary.BigEndian.Uint32(head[4:8]) {
		case sslRequestCode:
			c.Write([]byte{byte(p.reply.Load())})
		case gssRequestCode:
			c.Write([]byte{'N'})
		default:
			p.startups.Add(1)
			c.Write(fatal("3D000", "discoverytest: not a real server"))
			return
		}
	}
}

// fatal builds an ErrorResponse message with severity FATAL.
func fatal(code, msg string) []byte {
	var body []byte
	for _, f := range [][2]string{{"S", "FATAL"}, {"V", "FATAL"}, {"C", code}, {"M", msg}} {
		body = append(body, f[0]...)
		body = append(body, f[1]...)
		body = append(body, 0)
	}
	body = append(body, 0)
	out := []byte{'E', 0, 0, 0, 0}
	binary.BigEndian.PutUint32(out[1:], uint32(4+len(body)))
	return append(out, body...)
}

// Silent accepts connections and never sends a byte: a node that hangs.
type Silent struct {
	// Addr is where it listens.
	Addr netip.AddrPort

	srv *tcpServer
}

// NewSilent starts a Silent on 127.0.0.1 and a free port. It is stopped
// when the test ends.
func NewSilent(tb TB) *Silent {
	tb.Helper()
	ln := Listen(tb, "127.0.0.1:0")
	s := &Silent{Addr: addrOf(ln)}
	s.srv = startTCP(ln, func(c net.Conn) { io.Copy(io.Discard, c) })
	tb.Cleanup(s.Close)
	return s
}

// Close stops it and closes its connections.
func (s *Silent) Close() { s.srv.close() }
