package test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/proc"
)

// netns is a network namespace a test made: only its loopback, with the
// addresses the test gives it, so nothing sent inside can leave the
// machine, and port 53 is free whatever the host runs.
type netns struct {
	t    *testing.T
	path string // /proc/PID/ns/net of the process holding it
}

// newNetns makes a network namespace held by a sleeping child (unshare -n),
// brings its loopback up with addrs (CIDR prefixes) on it, and removes it
// when the test ends. It needs root (or CAP_SYS_ADMIN), unshare, nsenter and
// ip: a test that cannot have them fails saying which.
func newNetns(t *testing.T, addrs ...string) *netns {
	t.Helper()
	for _, tool := range []string{"unshare", "nsenter", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is needed to make the test's network namespace (util-linux, iproute2): %v", tool, err)
		}
	}
	cmd := exec.Command("unshare", "--net", "--", "sleep", "3600")
	holder, err := proc.Start(cmd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(holder.Kill)
	n := &netns{t: t, path: fmt.Sprintf("/proc/%d/ns/net", holder.Pid())}
	own, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	// unshare enters the namespace before it runs sleep: wait for that.
	err = pgtest.WaitFor(5*time.Second, func() error {
		if holder.Exited() {
			return fmt.Errorf("unshare --net exited (%s): a network namespace needs root or CAP_SYS_ADMIN", holder.State())
		}
		if ns, err := os.Readlink(n.path); err != nil || ns == own {
			return fmt.Errorf("the child is not in its own network namespace yet (%s, %v)", ns, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	n.run("ip", "link", "set", "lo", "up")
	for _, a := range addrs {
		args := []string{"ip", "addr", "add", a, "dev", "lo"}
		if strings.Contains(a, ":") {
			args = append(args, "nodad")
		}
		n.run(args...)
	}
	return n
}

// command is name with args, run inside the namespace.
func (n *netns) command(name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--net=" + n.path, "--", name}, args...)...)
}

// run runs a command inside the namespace, failing the test if it fails.
func (n *netns) run(args ...string) string {
	n.t.Helper()
	out, err := n.command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		n.t.Fatalf("%s (in the test's network namespace): %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// coreDNS starts bin/coredns inside the namespace with corefile, stopped
// when the test ends (its log shown if the test failed), and returns once
// it answers question (a dig query: "@ADDR NAME TYPE") with an answer.
func (n *netns) coreDNS(name, corefile string, question ...string) *coretest.Instance {
	t := n.t
	t.Helper()
	dir := t.TempDir()
	conf := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(conf, []byte(corefile), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := coreDNSBuild.Binary(t)
	return coretest.Start(t, coretest.Config{
		Name: name,
		Command: func(coretest.Ports) (*exec.Cmd, error) {
			cmd := n.command(bin, "-conf", conf)
			cmd.Dir = dir
			return cmd, nil
		},
		Ready: func(*coretest.Instance) error {
			out, err := n.command("dig", append([]string{"+time=1", "+tries=1", "+short"}, question...)...).CombinedOutput()
			if err != nil || len(bytes.TrimSpace(out)) == 0 {
				return fmt.Errorf("%s does not answer dig %s: %v %s", name, strings.Join(question, " "), err, out)
			}
			return nil
		},
		ReadyTimeout: 30 * time.Second,
		Poll:         5 * time.Millisecond,
		StopTimeout:  stopTimeout,
	})
}
