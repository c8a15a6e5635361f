package discoverytest

import (
	"io"
	"net"
	"net/netip"
	"time"
)

// Proxy forwards TCP connections to a target and holds the target's first
// reply on each connection back by a delay: the target, that much farther
// away. Everything else passes through untouched.
type Proxy struct {
	// Addr is where it listens.
	Addr netip.AddrPort

	target string
	delay  time.Duration
	srv    *tcpServer
}

// NewProxy starts a Proxy to target ("host:port") on 127.0.0.1 and a free
// port. It is stopped when the test ends.
func NewProxy(tb TB, target string, delay time.Duration) *Proxy {
	tb.Helper()
	ln := Listen(tb, "127.0.0.1:0")
	p := &Proxy{Addr: addrOf(ln), target: target, delay: delay}
	p.srv = startTCP(ln, p.handle)
	tb.Cleanup(p.Close)
	return p
}

// Close stops it and closes its connections.
func (p *Proxy) Close() { p.srv.close() }

func (p *Proxy) handle(client net.Conn) {
	upstream, err := net.Dial("tcp", p.target)
	if err != nil {
		return
	}
	defer upstream.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		io.Copy(upstream, client)
		upstream.(*net.TCPConn).CloseWrite()
	}()
	buf := make([]byte, 32<<10)
	n, err := upstream.Read(buf)
	if n > 0 {
		time.Sleep(p.delay) // the distance this proxy simulates
		if _, err := client.Write(buf[:n]); err == nil {
			io.Copy(client, upstream)
		}
	} else if err != nil {
		client.Close()
	}
	client.Close()
	<-done
}
