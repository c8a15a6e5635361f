package discoverytest

import (
	"net"
	"net/netip"
	"sync"
)

// tcpServer accepts connections and hands each to handle in its own
// goroutine; close stops accepting, closes the connections still open and
// waits for their goroutines.
type tcpServer struct {
	ln     net.Listener
	handle func(net.Conn)

	mu     sync.Mutex
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup
}

func startTCP(ln net.Listener, handle func(net.Conn)) *tcpServer {
	s := &tcpServer{ln: ln, handle: handle, conns: make(map[net.Conn]bool)}
	s.wg.Go(s.accept)
	return s
}

func (s *tcpServer) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = true
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer s.forget(c)
			s.handle(c)
		}()
	}
}

func (s *tcpServer) forget(c net.Conn) {
	c.Close()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
}

func (s *tcpServer) close() {
	s.ln.Close()
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Listen listens on addr over TCP or fails the test.
func Listen(tb TB, addr string) net.Listener {
	tb.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		tb.Fatalf("discoverytest: listen %s: %v", addr, err)
	}
	return ln
}

// ListenSamePort listens on one port, the same on every ip (loopback
// addresses such as 127.0.0.2), as nodes that differ only by address do.
func ListenSamePort(tb TB, ips ...string) []net.Listener {
	tb.Helper()
	for range 50 {
		first := Listen(tb, net.JoinHostPort(ips[0], "0"))
		lns := []net.Listener{first}
		port := addrOf(first).Port()
		for _, ip := range ips[1:] {
			ln, err := net.Listen("tcp", netip.AddrPortFrom(netip.MustParseAddr(ip), port).String())
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		if len(lns) == len(ips) {
			return lns
		}
		for _, ln := range lns {
			ln.Close()
		}
	}
	tb.Fatalf("discoverytest: no port free on all of %v", ips)
	return nil
}

func addrOf(ln net.Listener) netip.AddrPort {
	return ln.Addr().(*net.TCPAddr).AddrPort()
}
