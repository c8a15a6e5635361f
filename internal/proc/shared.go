package proc

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
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
// open, no one else is given the port. The port is also reserved for a few
// minutes against every other process on the machine that asks here, as
// test packages run at once: once the listeners are closed, a CoreDNS
// binds the port with SO_REUSEPORT, and two of them given the same port
// would share it without an error, one's metrics answering for the other.
func HoldPort(host string, udp bool) (int, []io.Closer, error) {
	var last error
	var passed []io.Closer // ports reserved by another process, held so bind does not give them again
	defer func() {
		for _, c := range passed {
			c.Close()
		}
	}()
	for range 20 {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return 0, nil, fmt.Errorf("find a free port on %s: %w", host, err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		held := []io.Closer{l}
		if udp {
			u, err := net.ListenPacket("udp", net.JoinHostPort(host, strconv.Itoa(port)))
			if err != nil {
				l.Close()
				last = err
				continue
			}
			held = append(held, u)
		}
		if !reserve(port) {
			passed = append(passed, held...)
			last = fmt.Errorf("port %d reserved by another process", port)
			continue
		}
		return port, held, nil
	}
	return 0, nil, errors.Join(fmt.Errorf("no port of %s free (for UDP too: %v)", host, udp), last)
}

// reservations is where reserve keeps one file per port given out.
var reservations = filepath.Join(os.TempDir(), "pgcluster-test-ports")

// reserveFor is how long a port given out stays reserved: far longer than
// any process takes to bind the port it was given.
const reserveFor = 10 * time.Minute

// reserve reports whether port is now reserved for this process: no other
// process reserved it in the last reserveFor. A directory that cannot be
// written reserves nothing and refuses nothing.
func reserve(port int) bool {
	if err := os.MkdirAll(reservations, 0o777|os.ModeSticky); err != nil {
		return true
	}
	name := filepath.Join(reservations, strconv.Itoa(port))
	for range 2 {
		f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o666)
		if err == nil {
			f.Close()
			return true
		}
		if !errors.Is(err, fs.ErrExist) {
			return true
		}
		st, err := os.Stat(name)
		if err == nil && time.Since(st.ModTime()) < reserveFor {
			return false
		}
		os.Remove(name) // an old reservation: taken over
	}
	return false
}

// free lets go of the listeners HoldPort returned with port.
func free(port int, held []io.Closer, err error) (int, error) {
	for _, c := range held {
		c.Close()
	}
	return port, err
}
