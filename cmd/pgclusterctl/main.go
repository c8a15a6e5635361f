// Command pgclusterctl shows a pgcluster fleet as an operator needs it:
// every node of the registry, in or out, and why.
//
//	pgclusterctl status -postgres DSN [-redis URL] [-prefix P] [-zone Z]
//	                    [-stale-after D] [-allow-loopback] [-max-lag BYTES]
//	                    [-watch [-interval D]] [-json]
//
// status reads the registry (pgcluster_nodes) and, with -redis, what the
// fleet shares in Redis: each node's lease holder and the verdict of the
// instance that checks it. It judges each node as an instance with the same
// options does, with the instance's own code, and prints one table: the
// node's address, its role in the registry and as its check reads it, the
// registry's verdict, the check's, the replication lag, which instance holds
// its lease and checked it, in or out and why; then a line per cluster
// (serving, primary, split brain). -json prints the same as one JSON object
// (with -watch, one per line). Instances are named by their token in Redis,
// cut to 8 characters.
//
// The exit status is 0 when every cluster has exactly one serving primary,
// 1 when one has none or two (split brain), and 2 on a usage error or when
// the registry or Redis cannot be read; so status can gate a deployment
// script. With -watch it redraws every -interval until interrupted, and
// exits with the status of the last report.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit statuses.
const (
	exitOK     = 0 // every cluster has exactly one serving primary
	exitNotOK  = 1 // a cluster has none, or two
	exitFailed = 2 // usage error, or the registry or Redis could not be read
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: pgclusterctl status -postgres DSN [-redis URL] [flags]

Commands:
  status   every node of the registry, in or out and why, with the fleet's
           checks and leases from Redis (pgclusterctl status -h for flags)

Exit status: 0 when every cluster has exactly one serving primary, 1 when
one has none or two, 2 on a usage error or when the registry or Redis
cannot be read.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return exitFailed
	}
	switch args[0] {
	case "status":
		return runStatus(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "pgclusterctl: unknown command %q\n\n%s", args[0], usage)
	return exitFailed
}
