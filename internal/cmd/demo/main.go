// Command demo runs pgcluster on this machine: a real PostgreSQL on a loopback
// port holding a registry with a demo cluster, and bin/coredns serving
// pgcluster.lan from it on 127.0.0.1:5353. It prints what to try with dig and
// psql, and on Ctrl-C stops both and removes its temporary directory.
//
// make run builds and starts it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// Time limits of the demo.
const (
	answerTimeout = 30 * time.Second
	stopTimeout   = 10 * time.Second
)

type options struct {
	coredns string
	port    int
	pgport  int
	ready   string
	metrics string
}

func main() {
	var o options
	flag.StringVar(&o.coredns, "coredns", "bin/coredns", "the CoreDNS binary built with pgcluster (make build)")
	flag.IntVar(&o.port, "port", 5353, "DNS port on 127.0.0.1")
	flag.IntVar(&o.pgport, "pgport", 0, "PostgreSQL port on 127.0.0.1 (0: a free port)")
	flag.StringVar(&o.ready, "ready", "127.0.0.1:8181", "address of the ready plugin")
	flag.StringVar(&o.metrics, "metrics", "127.0.0.1:9153", "address of the prometheus plugin")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	coredns, err := filepath.Abs(o.coredns)
	if err != nil {
		return err
	}
	if _, err := os.Stat(coredns); err != nil {
		return fmt.Errorf("%s: %w (make build writes it)", o.coredns, err)
	}
	dnsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(o.port))
	if err := checkFree(dnsAddr, true); err != nil {
		return fmt.Errorf("DNS port %d on 127.0.0.1 is taken (%v): choose another with -port", o.port, err)
	}
	if err := checkFree(o.ready, false); err != nil {
		return fmt.Errorf("ready address %s is taken (%v): choose another with -ready", o.ready, err)
	}
	if err := checkFree(o.metrics, false); err != nil {
		return fmt.Errorf("metrics address %s is taken (%v): choose another with -metrics", o.metrics, err)
	}

	// Everything, PostgreSQL's template and data directories included, goes
	// in one temporary directory, removed on the way out. When root runs the
	// demo PostgreSQL runs as postgres, which must be able to enter it.
	tmp, err := os.MkdirTemp("", "pgcluster-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return err
	}
	os.Setenv("TMPDIR", tmp)

	fmt.Println("demo: starting PostgreSQL")
	pg, err := pgtest.Start(pgtest.Options{Port: o.pgport})
	if err != nil {
		return fmt.Errorf("start PostgreSQL: %w", err)
	}
	defer pg.Close()
	dsn := pg.DSN("")
	if err := seed(ctx, dsn); err != nil {
		return fmt.Errorf("write the demo registry: %w", err)
	}

	fmt.Println("demo: starting a PostgreSQL server for each node")
	nodes := startNodes(os.Stdout)
	for _, n := range nodes {
		defer n.Close()
	}

	conf := filepath.Join(tmp, "Corefile")
	err = os.WriteFile(conf, []byte(corefile(corefileConfig{port: o.port, ready: o.ready, metrics: o.metrics, dsn: dsn})), 0o644)
	if err != nil {
		return err
	}

	fmt.Println("demo: starting", o.coredns, "-conf", conf)
	cmd := exec.Command(coredns, "-conf", conf)
	cmd.Dir = tmp
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	// Its own process group, so Ctrl-C reaches the demo only and the demo
	// stops CoreDNS; and SIGTERM should the demo die first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start coredns: %w", err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	defer stopCoreDNS(cmd, exited)

	r, err := waitAnswer(ctx, dnsAddr, answerTimeout, exited)
	switch {
	case errors.Is(err, errExited):
		return fmt.Errorf("coredns exited before answering (%v); its output is above", waitErr)
	case errors.Is(err, context.Canceled):
		fmt.Println("\ndemo: interrupted; stopping")
		return nil
	case err != nil:
		return fmt.Errorf("coredns did not answer prod.%s: %w", zone, err)
	}
	instructions(os.Stdout, o, dsn, cmd.Process.Pid, conf, summary(r), tmp)
	checkInstructions(os.Stdout, o, nodes)

	select {
	case <-ctx.Done():
		fmt.Println("\ndemo: stopping CoreDNS and PostgreSQL, removing", tmp)
		return nil
	case <-exited:
		return fmt.Errorf("coredns exited by itself (%v); its output is above. Stopped PostgreSQL", waitErr)
	}
}

// stopCoreDNS asks CoreDNS to shut down, and kills it if it has not after
// stopTimeout.
func stopCoreDNS(cmd *exec.Cmd, exited <-chan struct{}) {
	select {
	case <-exited:
		return
	default:
	}
	cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-exited:
	case <-t.C:
		cmd.Process.Kill()
		<-exited
	}
}
