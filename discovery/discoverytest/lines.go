package discoverytest

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Lines runs a command, such as pgdiscover -watch, and hands out its
// standard output one line at a time as it is printed.
type Lines struct {
	cmd    *exec.Cmd
	lines  chan string
	mu     sync.Mutex
	stderr bytes.Buffer
	exited chan struct{}
	err    error
}

// StartLines starts cmd and reads its standard output. The command is killed
// when the test ends, unless Stop ended it.
func StartLines(tb TB, cmd *exec.Cmd) *Lines {
	tb.Helper()
	l := &Lines{cmd: cmd, lines: make(chan string, 100), exited: make(chan struct{})}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	cmd.Stderr = writerFunc(func(p []byte) (int, error) {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.stderr.Write(p)
	})
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start %s: %v", cmd.Path, err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			l.lines <- sc.Text()
		}
		close(l.lines)
		l.err = cmd.Wait()
		close(l.exited)
	}()
	tb.Cleanup(func() {
		cmd.Process.Kill()
		<-l.exited
	})
	return l
}

// Next returns the next line, or an error naming what was awaited when the
// command ends or prints nothing within timeout.
func (l *Lines) Next(timeout time.Duration, awaiting string) (string, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case line, ok := <-l.lines:
		if !ok {
			<-l.exited
			return "", fmt.Errorf("%s ended (%v) while awaiting %s; stderr: %s", l.cmd.Path, l.err, awaiting, l.Stderr())
		}
		return line, nil
	case <-t.C:
		return "", fmt.Errorf("no %s within %v", awaiting, timeout)
	}
}

// Stop interrupts the command and waits for it; it returns the lines printed
// since the last Next and how the command exited.
func (l *Lines) Stop() ([]string, error) {
	l.cmd.Process.Signal(syscall.SIGINT)
	var rest []string
	for line := range l.lines {
		rest = append(rest, line)
	}
	<-l.exited
	return rest, l.err
}

// Stderr is what the command printed on standard error so far.
func (l *Lines) Stderr() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stderr.String()
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
