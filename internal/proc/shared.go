package proc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
)

// Buffer is a bytes.Buffer safe for a process's output goroutine and its
// readers: give it as a command's Stdout and Stderr.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// FreeDNSPort returns a loopback port that was free a moment ago for both
// TCP and UDP, as a DNS server binds both.
func FreeDNSPort() (int, error) { return free(HoldPort("127.0.0.1", true)) }

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago:
// nothing listens there, so connections to it are refused.
func FreePort() (int, error) { return FreePortOn("127.0.0.1") }

// FreePortOn returns a TCP port on host that was free a moment ago.
func FreePortOn(host string) (int, error) { return free(HoldPort(host, false)) }

// HoldPort listens on a free TCP port of host and, when udp is set, on UDP
// at the same port, and returns the port and the listeners: while they are
// open, no one else is given the port.
func HoldPort(host string, udp bool) (int, []io.Closer, error) {
	var last error
	for range 10 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, nil, fmt.Errorf("find a free port on %s: %w", host, err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if !udp {
			return port, []io.Closer{l}, nil
		}
		u, err := net.ListenPacket("udp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err == nil {
			return port, []io.Closer{l, u}, nil
		}
		l.Close()
		last = err
	}
	return 0, nil, errors.Join(fmt.Errorf("no port of %s free for both TCP and UDP", host), last)
}

// free lets go of the listeners HoldPort returned with port.
func free(port int, held []io.Closer, err error) (int, error) {
	for _, c := range held {
		c.Close()
	}
	return port, err
}
