package lock

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServerPath is the redis-server the tests run; the setup script
// installs it.
const redisServerPath = "/usr/bin/redis-server"

// redisServer is a real redis-server on a loopback port, for one test.
type redisServer struct {
	Addr string
	cmd  *exec.Cmd
	done chan struct{} // closed when the process has exited
}

// startRedis starts a redis-server on a free loopback port, without
// persistence, waits until it answers PING and stops it when t ends. A
// missing redis-server fails the test.
func startRedis(t *testing.T) *redisServer {
	t.Helper()
	bin := redisServerPath
	if _, err := os.Stat(bin); err != nil {
		p, lerr := exec.LookPath("redis-server")
		if lerr != nil {
			t.Fatalf("redis-server is missing (not at %s, not in PATH): install it (apt-get install redis-server) to run the lock tests: %v", redisServerPath, err)
		}
		bin = p
	}
	var last error
	// A free port found by listening can be taken again before redis-server
	// binds it; try another one then.
	for range 3 {
		s, err := tryRedis(t, bin)
		if err == nil {
			return s
		}
		last = err
	}
	t.Fatalf("cannot start redis-server: %v", last)
	return nil
}

func tryRedis(t *testing.T, bin string) (*redisServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir := t.TempDir()
	cmd := exec.Command(bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning")
	cmd.Stdout = &lineLog{t: t}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	s := &redisServer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.done) }()
	if err := s.waitPing(10 * time.Second); err != nil {
		s.stop()
		return nil, err
	}
	t.Cleanup(s.stop)
	return s, nil
}

// waitPing waits until the server answers PING, or fails after d or when
// the process exits.
func (s *redisServer) waitPing(d time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("redis-server on %s exited before answering PING: %v", s.Addr, s.cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s does not answer PING after %v: %w", s.Addr, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the server: SIGTERM, then SIGKILL if it has not exited in 5 s.
func (s *redisServer) stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// client returns a client of the server, closed when t ends.
func (s *redisServer) client(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lineLog sends the server's output to the test log, so that a failing test
// shows it.
type lineLog struct{ t *testing.T }

func (l *lineLog) Write(p []byte) (int, error) {
	l.t.Logf("redis-server: %s", p)
	return len(p), nil
}

// eventually waits until cond holds, failing t after d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
