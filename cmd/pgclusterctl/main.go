// Command pgclusterctl shows a pgcluster fleet as an operator needs it:
// every node of the registry, in or out, and why; and drains nodes for
// maintenance.
//
//	pgclusterctl status -postgres DSN [-redis URL] [-prefix P] [-segment S] [-zone Z]
//	                    [-stale-after D] [-allow-loopback] [-max-lag BYTES]
//	                    [-watch [-interval D]] [-json]
//	pgclusterctl drain -postgres DSN -cluster C [-node N | -topology-zone Z]
//	                   -reason TEXT [-for D] [-force] [-redis URL] [-json]
//	pgclusterctl undrain -postgres DSN ID
//	pgclusterctl undrain -postgres DSN -cluster C -node N
//	pgclusterctl drains -postgres DSN [-all] [-json]
//	pgclusterctl failback -postgres DSN ALIAS
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
//
// drain adds a row to pgcluster_drains: a node, a whole cluster, or the
// cluster's nodes in one topology zone leave every shared name of the
// cluster (a drained node keeps its own name), until -for passes on
// PostgreSQL's clock or the drain is deleted. Its guards, judged with
// status's judgement and the cluster's other active drains in the
// transaction that inserts it, under a lock per cluster, refuse (exit 1) to
// drain a primary, or the last serving nodes of the cluster's name or of
// standby., unless -force. A drain that matches no node now is made, with
// a warning. undrain deletes a drain by ID, or every drain of a node (exit 1
// when none matched); drains lists the active ones (-all: the ended ones
// too) with the nodes each matches now. failback points an alias that
// failed over at its own target again (exit 1 when it had not failed
// over). Each exits 2 on a usage error or when the registry cannot be
// used.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// Exit statuses.
const (
	exitOK     = 0 // status: every cluster has exactly one serving primary; the others: done
	exitNotOK  = 1 // status: a cluster has none, or two; drain: refused; undrain: no drain matched
	exitFailed = 2 // usage error, or the registry or Redis could not be read
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `usage: pgclusterctl status -postgres DSN [-redis URL] [flags]
       pgclusterctl drain -postgres DSN -cluster C [-node N | -topology-zone Z] -reason TEXT [flags]
       pgclusterctl undrain -postgres DSN (ID | -cluster C -node N)
       pgclusterctl drains -postgres DSN [-all] [-json]
       pgclusterctl failback -postgres DSN ALIAS

Commands:
  status   every node of the registry, in or out and why, with the fleet's
           checks and leases from Redis (pgclusterctl status -h for flags)
  drain    take a node, a cluster or a topology zone's nodes out of the
           cluster's shared names, with a reason, until -for passes or
           undrain; refused for a primary or the last serving nodes of a
           name unless -force (pgclusterctl drain -h)
  undrain  delete a drain by its ID, or the drains of one node
  drains   the active drains (-all: ended ones too), with the nodes each
           matches now
  failback point an alias that failed over at its own target again

Exit status: status: 0 when every cluster has exactly one serving primary,
1 when one has none or two. drain, undrain, drains, failback: 0 when done,
1 when a guard refused the drain, no drain matched undrain, or the alias
had not failed over. All: 2 on a usage error or when the registry or Redis
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
	case "drain":
		return runDrain(ctx, args[1:], stdout, stderr)
	case "failback":
		return runFailback(ctx, args[1:], stdout, stderr)
	case "undrain":
		return runUndrain(ctx, args[1:], stdout, stderr)
	case "drains":
		return runDrains(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usage)
		return exitOK
	}
	fmt.Fprintf(stderr, "pgclusterctl: unknown command %q\n\n%s", args[0], usage)
	return exitFailed
}

// parsed ends a command whose command line could not be parsed: exitOK for
// -help (the usage is printed), exitFailed with the error on stderr
// otherwise; done is false when err is nil and the command goes on.
func parsed(cmd string, err error, stderr io.Writer) (code int, done bool) {
	switch {
	case errors.Is(err, flag.ErrHelp):
		return exitOK, true
	case err != nil:
		fmt.Fprintln(stderr, "pgclusterctl "+cmd+":", err)
		return exitFailed, true
	}
	return 0, false
}
