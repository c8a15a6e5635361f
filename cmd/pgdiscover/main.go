// Command pgdiscover resolves a PostgreSQL cluster name through the
// cluster's DNS, probes every node in parallel and prints the fastest.
//
//	pgdiscover [-dns ADDR[,ADDR...]] [-port N] [-probe tcp|postgres]
//	           [-timeout D] [-json] [-v] [-watch] NAME
//
// The first line of standard output is the chosen ip:port. -v adds every
// candidate with its latency. -watch then keeps resolving NAME and prints
// "+ ip:port" and "- ip:port" as nodes join and leave, until interrupted.
// With no reachable node it prints why on standard error and exits 1; a
// usage error exits 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/pgcluster/pgcluster/discovery"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the command line.
type options struct {
	name     string
	servers  []string
	port     uint
	probe    string
	timeout  time.Duration
	interval time.Duration
	json     bool
	verbose  bool
	watch    bool
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("pgdiscover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dns := fs.String("dns", "", "DNS servers `ADDR[,ADDR...]` asked directly, in failover order; ADDR is host:port or host (port 53) (default: the nameservers of /etc/resolv.conf)")
	fs.UintVar(&o.port, "port", 0, "port of every node (default: from the SRV records _postgresql._tcp.NAME, else 5432)")
	fs.StringVar(&o.probe, "probe", "postgres", "how to measure a node: tcp (connect time) or postgres (SSLRequest round trip, no credentials)")
	fs.DurationVar(&o.timeout, "timeout", discovery.DefaultProbeTimeout, "probe timeout (all nodes are probed in parallel), and the timeout of each DNS query")
	fs.DurationVar(&o.interval, "interval", discovery.DefaultWatchInterval, "with -watch: longest time between two resolutions, whatever the TTL")
	fs.BoolVar(&o.json, "json", false, "print JSON lines: the result, then with -watch one object per change")
	fs.BoolVar(&o.verbose, "v", false, "print every candidate with its latency, and with -watch primary changes and errors on standard error")
	fs.BoolVar(&o.watch, "watch", false, "keep resolving NAME and print + ip:port and - ip:port as nodes join and leave")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: pgdiscover [flags] NAME\n\nResolves NAME through DNS, probes its nodes in parallel and prints the fastest as ip:port.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return o, errors.New("want exactly one NAME")
	}
	o.name = fs.Arg(0)
	if *dns != "" {
		o.servers = strings.Split(*dns, ",")
	}
	if o.port > 65535 {
		return o, fmt.Errorf("-port %d: out of range", o.port)
	}
	if o.timeout <= 0 || o.interval <= 0 {
		return o, errors.New("-timeout and -interval must be positive")
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "pgdiscover: %v\n", err)
		return 2
	}
	prober, err := discovery.ParseProbe(o.probe)
	if err != nil {
		fmt.Fprintf(stderr, "pgdiscover: -probe: %v\n", err)
		return 2
	}
	cl, err := discovery.New(discovery.Config{
		Servers:      o.servers,
		DNSTimeout:   o.timeout,
		Port:         uint16(o.port),
		Prober:       prober,
		ProbeTimeout: o.timeout,
	})
	if err != nil {
		fmt.Fprintf(stderr, "pgdiscover: %v\n", err)
		return 2
	}
	out := &printer{w: stdout, json: o.json, verbose: o.verbose}
	if o.watch {
		return watch(ctx, cl, o, out, stderr)
	}
	res, err := cl.Discover(ctx, o.name)
	return report(out, stderr, res, err)
}

// report prints a result, or why there is none.
func report(out *printer, stderr io.Writer, res discovery.Result, err error) int {
	out.result(res, err)
	if err != nil {
		fmt.Fprintf(stderr, "pgdiscover: %v\n", err)
		return 1
	}
	return 0
}

// watch prints the fastest node, then every change until ctx ends.
func watch(ctx context.Context, cl *discovery.Client, o options, out *printer, stderr io.Writer) int {
	opts := discovery.WatchOptions{
		Interval: o.interval,
		OnEvent: func(e discovery.Event) {
			switch {
			case e.Reason == discovery.ReasonInitial:
			case e.Primary:
				if o.verbose {
					fmt.Fprintf(stderr, "pgdiscover: primary %s (%s)\n", e, e.Reason)
				}
			default:
				out.event(e)
			}
		},
		OnError: func(err error) {
			if o.verbose {
				fmt.Fprintf(stderr, "pgdiscover: %v (keeping the last answer)\n", err)
			}
		},
	}
	w, err := cl.Watch(ctx, o.name, opts)
	if err != nil {
		fmt.Fprintf(stderr, "pgdiscover: %v\n", err)
		return 1
	}
	defer w.Close()
	r, err := w.Rank(ctx)
	if code := report(out, stderr, discovery.Result{Answer: w.Answer(), Ranking: r}, err); code != 0 {
		return code
	}
	<-ctx.Done()
	return 0
}
