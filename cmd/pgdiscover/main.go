// Command pgdiscover resolves a PostgreSQL cluster name through the
// cluster's DNS, probes every node in parallel and prints the fastest.
//
//	pgdiscover [-dns ADDR[,ADDR...]] [-port N] [-probe tcp|postgres]
//	           [-timeout D] [-max-probes N] [-json] [-v] [-watch [-interval D]] NAME
//
// The first line of standard output is the chosen ip:port. -v adds every
// candidate with its latency. -watch then keeps resolving NAME and prints
// "+ ip:port" and "- ip:port" as nodes join and leave, until interrupted.
// -max-probes bounds the candidates probed (32). With no reachable node,
// or no address (NXDOMAIN or not, it says which), it prints why on standard
// error and exits 1; a usage error (an empty -dns, a bad port, an -interval
// below 100ms, a NAME that is not a domain name or carries a port) exits 2
// with a message, before any DNS query.
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

// newClient builds the discovery client; tests replace it to see that a
// usage error stops pgdiscover before any client, and so any query, exists.
var newClient = discovery.New

// options are the command line.
type options struct {
	name      string
	servers   []string
	port      uint
	probe     string
	timeout   time.Duration
	interval  time.Duration
	maxProbes int
	json      bool
	verbose   bool
	watch     bool
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("pgdiscover", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dns := fs.String("dns", "", "DNS servers `ADDR[,ADDR...]` asked directly, in failover order; ADDR is host:port or host (port 53) (default, when -dns is left out: the nameservers of /etc/resolv.conf)")
	fs.UintVar(&o.port, "port", 0, "port of every node (default: from the SRV records _postgresql._tcp.NAME, else 5432)")
	fs.StringVar(&o.probe, "probe", "postgres", "how to measure a node: tcp (connect time) or postgres (SSLRequest round trip, no credentials)")
	fs.DurationVar(&o.timeout, "timeout", discovery.DefaultProbeTimeout, "probe timeout (all nodes are probed in parallel), and the timeout of each DNS query")
	fs.DurationVar(&o.interval, "interval", discovery.DefaultWatchInterval, fmt.Sprintf("with -watch: longest time between two resolutions, whatever the TTL (at least %s)", discovery.MinWatchInterval))
	fs.IntVar(&o.maxProbes, "max-probes", discovery.DefaultMaxProbes, "probe at most `N` candidates, the first ones of the DNS answer")
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
	if err := checkName(o.name); err != nil {
		return o, err
	}
	dnsSet := false
	fs.Visit(func(f *flag.Flag) { dnsSet = dnsSet || f.Name == "dns" })
	if dnsSet {
		servers, err := parseServers(*dns)
		if err != nil {
			return o, err
		}
		o.servers = servers
	}
	switch {
	case o.port > 65535:
		return o, fmt.Errorf("-port %d: out of range (1-65535)", o.port)
	case o.timeout <= 0:
		return o, fmt.Errorf("-timeout %s: must be positive", o.timeout)
	case o.interval < discovery.MinWatchInterval:
		return o, fmt.Errorf("-interval %s: below the floor of %s (each resolution sends several DNS queries)", o.interval, discovery.MinWatchInterval)
	case o.maxProbes < 1:
		return o, fmt.Errorf("-max-probes %d: must be at least 1", o.maxProbes)
	}
	return o, nil
}

// checkName refuses what cannot be a name to resolve, saying why, before
// any query; a port in it gets a hint at -port.
func checkName(name string) error {
	if host, port, err := net.SplitHostPort(name); err == nil && host != "" {
		return fmt.Errorf("NAME %q has a port: give the name alone and the port with -port (pgdiscover -port %s %s)", name, port, host)
	}
	if err := discovery.CheckName(name); err != nil {
		return fmt.Errorf("NAME: %s", strings.TrimPrefix(err.Error(), "discovery: "))
	}
	return nil
}

// parseServers parses the value of -dns, given on the command line: it
// must name at least one server, and each must parse.
func parseServers(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, fmt.Errorf("-dns %q: empty; name a DNS server as host or host:port, or leave -dns out to ask the nameservers of %s", list, discovery.DefaultResolvConf)
	}
	var servers []string
	for _, s := range strings.Split(list, ",") {
		if strings.TrimSpace(s) == "" {
			return nil, fmt.Errorf("-dns %q: an empty address in the list", list)
		}
		if _, err := discovery.ParseServer(s); err != nil {
			return nil, fmt.Errorf("-dns: %s", strings.TrimPrefix(err.Error(), "discovery: "))
		}
		servers = append(servers, s)
	}
	return servers, nil
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
	cl, err := newClient(discovery.Config{
		Servers:      o.servers,
		DNSTimeout:   o.timeout,
		Port:         uint16(o.port),
		Prober:       prober,
		ProbeTimeout: o.timeout,
		MaxProbes:    o.maxProbes,
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

// report prints a result, or why there is none; with -v (text), what was
// left out of it goes to standard error.
func report(out *printer, stderr io.Writer, res discovery.Result, err error) int {
	out.result(res, err)
	if out.verbose && !out.json {
		leftOut(stderr, res)
	}
	if err != nil {
		fmt.Fprintf(stderr, "pgdiscover: %v\n", err)
		return 1
	}
	return 0
}

// leftOut says what a big cluster's answer did not hold or what was not
// probed.
func leftOut(stderr io.Writer, res discovery.Result) {
	if res.Truncated {
		fmt.Fprintf(stderr, "pgdiscover: the DNS answer holds part of the nodes (TC bit over TCP): %d candidates\n", len(res.Candidates))
	}
	if res.Unresolved > 0 {
		fmt.Fprintf(stderr, "pgdiscover: %d SRV targets came without an address and were left out (at most %d are asked for)\n", res.Unresolved, discovery.MaxUnglued)
	}
	if res.NotProbed > 0 {
		fmt.Fprintf(stderr, "pgdiscover: probed the first %d of %d candidates (-max-probes)\n", len(res.Ranking), len(res.Candidates))
	}
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
	ans := w.Answer()
	r, err := w.Rank(ctx)
	res := discovery.Result{Answer: ans, Ranking: r, NotProbed: max(len(ans.Candidates)-len(r), 0)}
	if code := report(out, stderr, res, err); code != 0 {
		return code
	}
	<-ctx.Done()
	return 0
}
