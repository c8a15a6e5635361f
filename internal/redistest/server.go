// Package redistest starts real redis-server processes on free loopback ports,
// for tests and for the demo: a single server that can be stopped, started
// again on the same port, frozen with SIGSTOP and killed, and a Sentinel
// group (a master, a replica and three sentinels) that can fail over.
//
// Servers keep nothing on disk (no RDB snapshots, no AOF): a restarted
// server is empty, as a Redis that lost its data.
package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// ServerPath is where the setup script installs redis-server; PATH is
// searched when it is not there.
const ServerPath = "/usr/bin/redis-server"

// Time limits.
const (
	// readyTimeout bounds the wait for a started server to answer PING.
	readyTimeout = 10 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
	stopGrace = 5 * time.Second
	// rebindTimeout bounds how long Start retries binding the old port.
	rebindTimeout = 5 * time.Second
	// pollInterval is the pause between two polls of a condition.
	pollInterval = 10 * time.Millisecond
	// freshPorts is how many free ports a first start tries: another
	// process may take a free port before redis-server binds it.
	freshPorts = 3
)

// Binary returns the redis-server to run: ServerPath, or the one in PATH.
func Binary() (string, error) {
	if _, err := os.Stat(ServerPath); err == nil {
		return ServerPath, nil
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("redis-server is missing (not at %s, not in PATH): install redis-server (apt-get install -y redis-server)", ServerPath)
}

// Server is one redis-server process (or a sentinel) on a loopback port. The
// port stays the same across Stop and Start.
type Server struct {
	bin  string
	dir  string
	name string // what the log lines are prefixed with
	logw io.Writer
	args func(port int) ([]string, error) // the command line for a port
	tls  *tls.Config                      // the clients' TLS settings; nil: plain TCP

	mu   sync.Mutex
	port int
	p    *proc.Process // nil while stopped
}

// StartProcess starts a redis-server on a free port of 127.0.0.1 without
// persistence, working in dir, its output sent to logw (nil: discarded), and
// returns once it answers PING. The caller stops it with Stop.
func StartProcess(dir string, logw io.Writer) (*Server, error) {
	return startServer(dir, logw, "redis-server", serverArgs(dir, "warning"))
}

// serverArgs returns the command line of a data server on a port, with
// extra options appended.
func serverArgs(dir, loglevel string, extra ...string) func(int) ([]string, error) {
	return func(port int) ([]string, error) {
		return append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir,
			"--loglevel", loglevel,
		}, extra...), nil
	}
}

// startServer starts a server on a free port, trying another port when
// the process exits before answering (the port was taken meanwhile).
func startServer(dir string, logw io.Writer, name string, args func(int) ([]string, error)) (*Server, error) {
	return startServerTLS(dir, logw, name, args, nil)
}

// startServerTLS is startServer for a server that clients reach over TLS
// with tlsc (nil: plain TCP).
func startServerTLS(dir string, logw io.Writer, name string, args func(int) ([]string, error), tlsc *tls.Config) (*Server, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	if logw == nil {
		logw = io.Discard
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	s := &Server{bin: bin, dir: dir, name: name, logw: logw, args: args, tls: tlsc}
	var last error
	for range freshPorts {
		port, err := proc.FreePort()
		if err != nil {
			return nil, err
		}
		s.port = port
		exited, err := s.launch()
		if err == nil {
			return s, nil
		}
		last = err
		if !exited {
			break
		}
	}
	return nil, last
}

// Addr returns the server's host:port.
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addr()
}

func (s *Server) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL returns the redis:// URL of the server, rediss:// for one started
// with StartTLSProcess.
func (s *Server) URL() string {
	if s.tls != nil {
		return "rediss://" + s.Addr()
	}
	return "redis://" + s.Addr()
}

// NiceFromEnv runs the server at the nice value the environment variable
// name gives, when it is set (a benchmark's Redis on a machine of its own,
// ahead of the processes it serves): it returns that value and whether it
// was set, or why it could not be.
func (s *Server) NiceFromEnv(name string) (int, bool, error) {
	v := os.Getenv(name)
	if v == "" {
		return 0, false, nil
	}
	nice, err := strconv.Atoi(v)
	if err != nil {
		return 0, false, fmt.Errorf("%s=%q: %v", name, v, err)
	}
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, s.Pid(), nice); err != nil {
		return 0, false, fmt.Errorf("redis-server at nice %d: %v", nice, err)
	}
	return nice, true, nil
}

// Pid returns the process id of the running server, 0 while it is stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil || s.p.Exited() {
		return 0
	}
	return s.p.Pid()
}

// Start starts a stopped (or killed) server again on the same port and
// returns once it answers PING. The port may linger for a moment after the
// old process: Start retries binding it for a few seconds.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil && !s.p.Exited() {
		return fmt.Errorf("%s %s is already running (pid %d)", s.name, s.addr(), s.p.Pid())
	}
	deadline := time.Now().Add(rebindTimeout)
	for {
		exited, err := s.launch()
		if err == nil {
			return nil
		}
		if !exited || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop ends the server: SIGCONT (in case it is frozen), SIGTERM, and
// SIGKILL if it has not exited within 5 s. Stopping a stopped server does
// nothing.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil {
		_ = s.p.Stop(stopGrace)
	}
}

// Kill ends the server with SIGKILL and waits until it is gone.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p != nil {
		s.p.Kill()
	}
}

// Freeze stops the server with SIGSTOP: it keeps its connections open and
// answers nothing, as a Redis stuck or cut off. It returns once the kernel
// reports the process stopped.
func (s *Server) Freeze() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil {
		return fmt.Errorf("%s %s is not running", s.name, s.addr())
	}
	return s.p.Freeze()
}

// Thaw resumes a frozen server with SIGCONT.
func (s *Server) Thaw() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.p == nil {
		return fmt.Errorf("%s %s is not running", s.name, s.addr())
	}
	return s.p.Thaw()
}

// launch starts the process on s.port and waits until it answers PING.
// exited says the process ended on its own (a taken port, most often).
func (s *Server) launch() (exited bool, err error) {
	args, err := s.args(s.port)
	if err != nil {
		return false, err
	}
	addr := s.addr()
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	out := &proc.LineWriter{W: s.logw, Prefix: s.name + " " + addr + ": "}
	cmd.Stdout, cmd.Stderr = out, out
	p, err := proc.Start(cmd)
	if err != nil {
		return false, err
	}
	if err := waitPing(addr, s.tls, p); err != nil {
		if p.Exited() {
			return true, fmt.Errorf("%s on %s exited before answering PING (%s); its output is in the log", s.name, addr, p.State())
		}
		p.Kill()
		return false, err
	}
	s.p = p
	return false, nil
}

// waitPing waits until addr answers PING (over TLS with tlsc), or fails
// after readyTimeout or when p exits.
func waitPing(addr string, tlsc *tls.Config, p *proc.Process) error {
	c := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: tlsc, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true})
	defer c.Close()
	deadline := time.Now().Add(readyTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if p.Exited() {
			return errors.New("exited")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis on %s does not answer PING after %v: %w", addr, readyTimeout, err)
		}
		time.Sleep(pollInterval)
	}
}

// client returns a client of the server for one call, with no retries.
func (s *Server) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: s.tls, MaxRetries: -1, DialTimeout: time.Second, ContextTimeoutEnabled: true})
}
