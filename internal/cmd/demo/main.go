// Command demo runs a small pgcluster fleet on this machine: a real
// PostgreSQL on a loopback port holding a registry with a demo cluster whose
// nodes are real PostgreSQL servers (each on its own loopback address, on a
// free port: two demos never share a server), a real redis-server, and three
// bin/coredns instances serving pgcluster.lan from the registry on loopback
// ports, sharing their health checks through Redis. It prints what to try
// with dig, psql and redis-cli, and on Ctrl-C (or SIGTERM, the terminal
// closed, its output's reader gone) stops everything and removes its
// temporary directory.
//
// make run builds and starts it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// Time limits of the demo.
const (
	answerTimeout = 30 * time.Second
	stopTimeout   = 10 * time.Second
	// settleTimeout bounds the wait for the fleet to share out the leases
	// before the demo says it is up.
	settleTimeout = 15 * time.Second
)

type options struct {
	coredns string
	port    int
	pgport  int
}

func main() {
	var o options
	flag.StringVar(&o.coredns, "coredns", "bin/coredns", "the CoreDNS binary built with pgcluster (make build)")
	flag.IntVar(&o.port, "port", 0, "DNS port of the first instance on 127.0.0.1, the others on the next two (0: free ports)")
	flag.IntVar(&o.pgport, "pgport", 0, "registry PostgreSQL port on 127.0.0.1 (0: a free port)")
	flag.Parse()

	// Kept until the demo exits: a second signal while it stops (another
	// write to a closed pipe, say) must not end it half-way.
	ctx, stop := signal.NotifyContext(context.Background(), stopSignals()...)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// stopSignals are the signals that stop the demo as Ctrl-C does, stopping
// everything it started: the PostgreSQL servers run detached (pg_ctl) and
// outlive a demo that dies instead. SIGPIPE is among them for the demo's
// output piped to a reader that is gone (make run | tee, and Ctrl-C ends
// tee as well): asked for, a write to the closed pipe fails and sends it,
// where Go would otherwise end the demo at once. SIGHUP is the terminal
// closed. SIGINT and SIGHUP are left alone when the demo was started with
// them ignored (nohup, a background job of a script): asking for them
// would undo that.
func stopSignals() []os.Signal {
	sigs := []os.Signal{syscall.SIGTERM, syscall.SIGPIPE}
	for _, s := range []os.Signal{os.Interrupt, syscall.SIGHUP} {
		if !signal.Ignored(s) {
			sigs = append(sigs, s)
		}
	}
	return sigs
}

func run(ctx context.Context, o options) error {
	// Ask for SIGUSR1 before anything starts, so that an early one does
	// not end the demo.
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)

	d, err := start(ctx, o, os.Stdout)
	if errors.Is(err, context.Canceled) {
		fmt.Printf("\ndemo: %v: stopped everything it had started\n", context.Cause(ctx))
		return nil
	}
	if err != nil {
		return err
	}
	defer func() {
		if err := d.stop(); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
		}
	}()
	instructions(os.Stdout, d)
	checkInstructions(os.Stdout, d)
	redisInstructions(os.Stdout, d, os.Getpid())
	return d.wait(ctx, usr1)
}

// demo is a running demo. Everything it started is under tmp.
type demo struct {
	w         io.Writer
	tmp       string
	oldTMPDIR string
	registry  *pgtest.Postgres
	dsn       string
	rows      []node                      // the nodes as in the registry, with their servers' ports
	nodes     map[string]*pgtest.Postgres // the nodes' servers, by node name
	redis     *redistest.Server
	fleet     []*instance
	answer    string       // what prod.Z answered first
	states    []fleetState // the fleet's modes and leases when it was up
	settleErr error        // why the fleet had not settled, if it had not
}

// start starts the demo: the registry, the nodes' servers, Redis and the
// fleet, writing what it does to w. It returns once every instance answers
// and, within settleTimeout, the fleet has shared out the leases. On error
// (context.Canceled when ctx is done first) it has stopped whatever it had
// started.
func start(ctx context.Context, o options, w io.Writer) (_ *demo, err error) {
	coredns, err := filepath.Abs(o.coredns)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(coredns); err != nil {
		return nil, fmt.Errorf("%s: %w (make build writes it)", o.coredns, err)
	}
	// Ports given on the command line are checked before anything starts:
	// a demo that cannot run says so in one line and leaves nothing
	// behind. Everything else takes free ports.
	if o.port != 0 {
		for i := range fleetSize {
			if err := checkFree(net.JoinHostPort("127.0.0.1", strconv.Itoa(o.port+i)), true); err != nil {
				return nil, fmt.Errorf("DNS port %d on 127.0.0.1 is taken (%v): choose another with -port, or leave -port out for free ports", o.port+i, err)
			}
		}
	}
	if o.pgport != 0 {
		if err := checkFree(net.JoinHostPort("127.0.0.1", strconv.Itoa(o.pgport)), false); err != nil {
			return nil, fmt.Errorf("registry port %d on 127.0.0.1 is taken (%v): choose another with -pgport, or leave -pgport out for a free port", o.pgport, err)
		}
	}

	// Everything, PostgreSQL's template and data directories and Redis's
	// included, goes in one temporary directory, removed on the way out.
	// When root runs the demo PostgreSQL runs as postgres, which must be
	// able to enter it.
	tmp, err := os.MkdirTemp("", "pgcluster-demo-")
	if err != nil {
		return nil, err
	}
	d := &demo{w: w, tmp: tmp, oldTMPDIR: os.Getenv("TMPDIR"), nodes: map[string]*pgtest.Postgres{}}
	os.Setenv("TMPDIR", tmp)
	defer func() {
		if err != nil {
			if serr := d.stop(); serr != nil {
				fmt.Fprintln(w, "demo:", serr)
			}
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}

	// The registry, the nodes' servers and Redis do not need each other:
	// they start at once (the first PostgreSQL server to start makes the
	// initdb template both copy). Each is kept as soon as it has started,
	// so that a failure of another stops it.
	fmt.Fprintln(w, "demo: starting PostgreSQL")
	fmt.Fprintln(w, "demo: starting a PostgreSQL server for each node")
	fmt.Fprintln(w, "demo: starting redis-server")
	var (
		wg                              sync.WaitGroup
		registryErr, nodesErr, redisErr error
	)
	wg.Go(func() {
		if d.registry, registryErr = pgtest.Start(pgtest.Options{Port: o.pgport}); registryErr != nil {
			registryErr = fmt.Errorf("start PostgreSQL: %w", registryErr)
		}
	})
	wg.Go(func() { d.rows, d.nodes, nodesErr = startNodes() })
	wg.Go(func() {
		if d.redis, redisErr = redistest.StartProcess(filepath.Join(tmp, "redis"), w); redisErr != nil {
			redisErr = fmt.Errorf("start redis-server: %w", redisErr)
		}
	})
	wg.Wait()
	if err := errors.Join(registryErr, nodesErr, redisErr); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.dsn = d.registry.DSN("")
	if err := seed(ctx, d.dsn, d.rows); err != nil {
		return nil, fmt.Errorf("write the demo registry: %w", err)
	}

	// The first instance takes the registry lease, following PostgreSQL
	// for the fleet, as it answers; the others then start at once and
	// read the registry it relays through Redis.
	c := corefileConfig{dsn: d.dsn, redis: d.redis.URL()}
	var first *dns.Msg
	if d.fleet, first, err = startFleet(ctx, w, coredns, o.coredns, tmp, o.port, c); err != nil {
		return nil, err
	}
	d.answer = summary(first)

	d.states, d.settleErr = waitMode(ctx, d.fleet, modeCoordinated, len(demoNodes), settleTimeout)
	if errors.Is(d.settleErr, context.Canceled) {
		return nil, d.settleErr
	}
	return d, nil
}

// stop stops the fleet first (its instances release their leases while
// Redis is there), then Redis and the PostgreSQL servers, all at once, and
// removes the temporary directory. A frozen process is thawed and stopped;
// one that does not stop is killed.
func (d *demo) stop() error {
	var errs []error
	errs = append(errs, stopFleet(d.fleet))
	var wg sync.WaitGroup
	if d.redis != nil {
		wg.Go(d.redis.Stop)
	}
	for _, n := range d.nodes {
		wg.Go(n.Close)
	}
	if d.registry != nil {
		wg.Go(d.registry.Close)
	}
	wg.Wait()
	if err := os.RemoveAll(d.tmp); err != nil {
		errs = append(errs, err)
	}
	if d.oldTMPDIR == "" {
		os.Unsetenv("TMPDIR")
	} else {
		os.Setenv("TMPDIR", d.oldTMPDIR)
	}
	return errors.Join(errs...)
}

// wait runs until ctx is done or every instance has exited. An instance
// that exits is reported; the others go on. On each SIGUSR1 it starts Redis
// again if it is stopped.
func (d *demo) wait(ctx context.Context, usr1 <-chan os.Signal) error {
	gone := make(chan *instance, len(d.fleet))
	for _, in := range d.fleet {
		go func() {
			<-in.Done()
			gone <- in
		}()
	}
	left := len(d.fleet)
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintf(d.w, "\ndemo: %v: stopping the fleet, Redis and PostgreSQL, removing %s\n", context.Cause(ctx), d.tmp)
			return nil
		case in := <-gone:
			if left--; left == 0 {
				return fmt.Errorf("every CoreDNS instance has exited, %s last (%s); their output is above. Stopped Redis and PostgreSQL", in.name, in.State())
			}
			fmt.Fprintf(d.w, "demo: %s (pid %d) exited (%s); %d instances go on\n", in.name, in.Pid(), in.State(), left)
		case <-usr1:
			d.redisBack()
		}
	}
}

// redisBack starts Redis again, on the same port, when it is not running.
func (d *demo) redisBack() {
	if pid := d.redis.Pid(); pid != 0 {
		fmt.Fprintf(d.w, "demo: redis-server is running (pid %d); if you froze it: kill -CONT %d\n", pid, pid)
		return
	}
	fmt.Fprintln(d.w, "demo: starting redis-server again on", d.redis.Addr())
	if err := d.redis.Start(); err != nil {
		fmt.Fprintln(d.w, "demo: redis-server did not start:", err)
		return
	}
	pid := d.redis.Pid()
	fmt.Fprintf(d.w, "demo: redis-server is back on %s (pid %d), empty: the instances rejoin and write their statuses again; freeze this one with kill -STOP %d, thaw it with kill -CONT %d\n", d.redis.Addr(), pid, pid, pid)
}
