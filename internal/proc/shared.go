package proc

import (
	"bytes"
	"errors"
	"fmt"
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
func FreeDNSPort() (int, error) {
	var last error
	for range 10 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a free loopback port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		l.Close()
		if err == nil {
			u.Close()
			return port, nil
		}
		last = err
	}
	return 0, errors.Join(errors.New("no loopback port free for both TCP and UDP"), last)
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago:
// nothing listens there, so connections to it are refused.
func FreePort() (int, error) { return FreePortOn("127.0.0.1") }

// FreePortOn returns a TCP port on host that was free a moment ago.
func FreePortOn(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("find a free port on %s: %w", host, err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
