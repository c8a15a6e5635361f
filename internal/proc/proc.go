// Package proc runs a child process for tests and the demo, and gives the
// faults they inject: stop it gracefully with a bound, kill it, freeze it
// with SIGSTOP and thaw it. Nothing started here outlives the parent: the
// child gets SIGKILL when the process that started it dies.
package proc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// pipeDelay bounds how long Wait keeps reading a child's output after it
// exited: a grandchild holding the pipe (redis-server's replication fork)
// must not hold the caller.
const pipeDelay = 2 * time.Second

// stateTimeout bounds how long Freeze and Thaw wait for the kernel to
// report the new state.
const stateTimeout = 2 * time.Second

// Process is a started child process.
type Process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
}

// Start starts cmd and reaps it when it exits. The child is killed when the
// caller dies.
func Start(cmd *exec.Cmd) (*Process, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = pipeDelay
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &Process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// State describes how the process ended; "running" before it has.
func (p *Process) State() string {
	if !p.Exited() {
		return "running"
	}
	return p.cmd.ProcessState.String()
}

// Kill sends SIGKILL and waits until the process is gone.
func (p *Process) Kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGCONT (a frozen process cannot act on SIGTERM) and SIGTERM,
// and waits up to grace for the process to exit. A process still there then
// is killed, and Stop says so in its error.
func (p *Process) Stop(grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
		p.Kill()
		return fmt.Errorf("%s (pid %d) did not exit within %v of SIGTERM and was killed", p.cmd.Path, p.Pid(), grace)
	}
}

// Freeze sends SIGSTOP and waits until the kernel reports the process
// stopped, so that on return it answers nothing.
func (p *Process) Freeze() error {
	if err := p.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	return p.waitState(true)
}

// Thaw sends SIGCONT and waits until the process runs again.
func (p *Process) Thaw() error {
	if err := p.signal(syscall.SIGCONT); err != nil {
		return err
	}
	return p.waitState(false)
}

func (p *Process) signal(sig syscall.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("send %v to %s (pid %d): %w", sig, p.cmd.Path, p.Pid(), err)
	}
	return nil
}

// waitState polls /proc until the process is stopped (or no longer stopped).
func (p *Process) waitState(stopped bool) error {
	deadline := time.Now().Add(stateTimeout)
	for {
		s, err := state(p.Pid())
		if err != nil {
			if errors.Is(err, os.ErrNotExist) || p.Exited() {
				return fmt.Errorf("%s (pid %d) has exited: %s", p.cmd.Path, p.Pid(), p.State())
			}
			return err
		}
		if s == 'Z' {
			return fmt.Errorf("%s (pid %d) has exited", p.cmd.Path, p.Pid())
		}
		if (s == 'T' || s == 't') == stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s (pid %d) is in state %c %v after the signal, want stopped=%v", p.cmd.Path, p.Pid(), s, stateTimeout, stopped)
		}
		time.Sleep(time.Millisecond)
	}
}

// state reads the one-letter state of a process from /proc/PID/stat.
func state(pid int) (byte, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// "pid (comm) S ...": comm may hold spaces and parentheses, the state
	// follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0, fmt.Errorf("unexpected /proc/%d/stat: %q", pid, s)
	}
	return s[i+2], nil
}
