package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func ping(s *Server, d time.Duration) error {
	c, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	cl := s.client()
	defer cl.Close()
	return cl.Ping(c).Err()
}

// gone reports whether no process has the pid any more.
func gone(pid int) bool { return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) }

// A stopped server refuses connections; started again it is on the same
// port, answers the client made before, and is empty (no persistence).
func TestRestartSamePort(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	addr, pid := s.Addr(), s.Pid()
	if s.URL() != "redis://"+addr {
		t.Errorf("URL() = %q, want redis://%s", s.URL(), addr)
	}

	s.Stop()
	s.Stop() // a second Stop does nothing
	if s.Pid() != 0 || !gone(pid) {
		t.Fatalf("after Stop: Pid() = %d, process %d still there = %v", s.Pid(), pid, !gone(pid))
	}
	if err := ping(s, time.Second); err == nil {
		t.Fatal("a stopped server answered PING")
	}

	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if s.Addr() != addr {
		t.Fatalf("restarted on %s, want the same address %s", s.Addr(), addr)
	}
	if s.Pid() == 0 || s.Pid() == pid {
		t.Errorf("restarted server has pid %d (old %d)", s.Pid(), pid)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		// The pool may hand out a connection to the old process once.
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatalf("the old client gets no answer from the restarted server: %v", err)
		}
	}
	if n := c.Exists(ctx, "k").Val(); n != 0 {
		t.Errorf("the restarted server still has k: it should keep nothing on disk")
	}
	if err := s.Start(); err == nil {
		t.Error("Start on a running server succeeded")
	}
}

// Start on the same port waits for the port to be free.
func TestRestartWaitsForPort(t *testing.T) {
	s := Start(t)
	s.Stop()
	l, err := net.Listen("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(time.Second)
		l.Close()
	}()
	if err := s.Start(); err != nil {
		t.Fatalf("Start while the port was taken for a second: %v", err)
	}
	if err := ping(s, time.Second); err != nil {
		t.Fatal(err)
	}
}

// A frozen server answers nothing: a PING with a 200 ms deadline times out.
// Thawed, it answers again.
func TestFreezeThaw(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Freeze(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	start := time.Now()
	err := c.Ping(ctx).Err()
	cancel()
	if err == nil {
		t.Fatal("a frozen server answered PING")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("PING to a frozen server with a 200ms deadline took %v", took)
	}
	var ne net.Error
	if !errors.Is(err, context.DeadlineExceeded) && !(errors.As(err, &ne) && ne.Timeout()) {
		t.Errorf("PING to a frozen server: %v, want a timeout", err)
	}

	if err := s.Thaw(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("a thawed server does not answer: %v", err)
	}
}

// The test's cleanup thaws a frozen server before stopping it, so it ends on
// SIGTERM at once instead of waiting for the SIGKILL.
func TestCleanupThawsFrozen(t *testing.T) {
	var pid int
	start := time.Now()
	t.Run("frozen", func(t *testing.T) {
		s := Start(t)
		pid = s.Pid()
		if err := s.Freeze(); err != nil {
			t.Fatal(err)
		}
	})
	if !gone(pid) {
		t.Fatalf("redis-server %d is still there after the test's cleanup", pid)
	}
	if took := time.Since(start); took >= stopGrace {
		t.Errorf("the cleanup took %v: the frozen server was not thawed before SIGTERM", took)
	}
}

// Kill ends the process at once; Start brings it back.
func TestKill(t *testing.T) {
	s := Start(t)
	pid := s.Pid()
	s.Kill()
	if !gone(pid) {
		t.Fatalf("redis-server %d is still there after Kill", pid)
	}
	if err := ping(s, time.Second); err == nil {
		t.Fatal("a killed server answered PING")
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := ping(s, time.Second); err != nil {
		t.Fatal(err)
	}
}

// A failover promotes the replica: the sentinels report it, and a write
// through the failover client lands on it.
func TestSentinelFailover(t *testing.T) {
	g := StartSentinel(t)
	ss := g.Sentinels()
	want := fmt.Sprintf("redis-sentinel://%s?addr=%s&addr=%s&master_name=%s", ss[0].Addr(), ss[1].Addr(), ss[2].Addr(), g.MasterName())
	if g.URL() != want {
		t.Errorf("URL() = %q, want %q", g.URL(), want)
	}
	c := g.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	old, promoted := g.Master(), g.Replica()

	g.Failover(t)
	if g.Master() != promoted || g.Replica() != old {
		t.Fatalf("after Failover, Master() = %s and Replica() = %s, want %s and %s", g.Master().Addr(), g.Replica().Addr(), promoted.Addr(), old.Addr())
	}
	direct := promoted.Client(t)
	if v := direct.Get(ctx, "before").Val(); v != "1" {
		t.Errorf("the promoted replica has before = %q, want 1 (replicated)", v)
	}
	// The client learns of the switch from the sentinels: a write through it
	// must reach the new master, not the old one.
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; ; i++ {
		v := strconv.Itoa(i)
		err := c.Set(ctx, "after", v, 0).Err()
		if err == nil && direct.Get(ctx, "after").Val() == v {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a write through the failover client does not reach the new master %s: %v", promoted.Addr(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
