package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// instructions prints where the demo runs and what to try.
func instructions(w io.Writer, o options, dsn string, pid int, conf, answer, tmp string) {
	dig := "dig @127.0.0.1 -p " + strconv.Itoa(o.port) + " "
	psql := "psql '" + dsn + "'"
	fmt.Fprintf(w, `
pgcluster demo is up.

  zone      %[1]s. on 127.0.0.1:%[2]d  (coredns pid %[3]d, Corefile %[4]s)
  registry  %[5]s
  metrics   http://%[6]s/metrics    ready: http://%[7]s/ready

prod.%[1]s answers: %[8]s

Try:
  %[9]sprod.%[1]s
  %[9]smyapp-db.%[1]s
  %[9]sprimary.prod.%[1]s
  %[9]sstandby.local.%[1]s
  %[9]sSRV _postgresql._tcp.local.%[1]s
  %[9]sTXT pg2.local.%[1]s

Each node is a real PostgreSQL server on its own address. Find the fastest,
and follow the topology as it changes:
  bin/pgdiscover -dns 127.0.0.1:%[2]d -v prod.%[1]s
  bin/pgdiscover -dns 127.0.0.1:%[2]d -watch -v primary.prod.%[1]s
  psql -h "$(bin/pgdiscover -dns 127.0.0.1:%[2]d primary.prod.%[1]s | cut -d: -f1)" -U postgres -c 'SELECT inet_server_addr()'

Take a node out of the answers through the registry, and bring it back:
  %[5]s -c "UPDATE pgcluster_nodes SET healthy = false WHERE cluster = 'local' AND name = 'pg3'"
  %[5]s -c "UPDATE pgcluster_nodes SET healthy = true WHERE cluster = 'local' AND name = 'pg3'"
Look at the registry:
  %[5]s -c "TABLE pgcluster_nodes" -c "TABLE pgcluster_aliases"

Ctrl-C stops CoreDNS and PostgreSQL and removes %[10]s.

`, zone, o.port, pid, conf, psql, o.metrics, o.ready, answer, dig, tmp)
}

// checkInstructions prints what to try with the health checks: stop a node's
// server and watch it leave, fail over for real.
func checkInstructions(w io.Writer, o options, nodes map[string]*pgtest.Postgres) {
	pg2, pg3 := nodes["pg2"], nodes["pg3"]
	if pg2 == nil || pg3 == nil {
		return
	}
	dig := "dig @127.0.0.1 -p " + strconv.Itoa(o.port) + " "
	fmt.Fprintf(w, `Every node is checked (check postgres): the role PostgreSQL reports decides
primary. and standby., whatever the registry's role column says. Stop pg3's
server and watch it leave within fall x interval + timeout (3 s here):
  watch -n1 %[1]s+short local.%[2]s
  %[3]s stop -m fast
  %[1]sTXT pg3.local.%[2]s    # reason=check_refused
  %[3]s start
Fail over for real: stop the primary pg1, promote pg2, and watch primary.:
  watch -n1 %[1]s+short primary.prod.%[2]s
  %[4]s stop -m fast && %[5]s promote

`, dig, zone, pgCtl(pg3), pgCtl(nodes["pg1"]), pgCtl(pg2))
}

// pgCtl is the pg_ctl command line for a node's server, as the user that
// runs it.
func pgCtl(pg *pgtest.Postgres) string {
	if pg == nil {
		return "pg_ctl"
	}
	bin, _ := pgtest.BinDir()
	cmd := filepath.Join(bin, "pg_ctl") + " -D " + filepath.Join(pg.Dir, "data") + " -l " + filepath.Join(pg.Dir, "log")
	if os.Geteuid() == 0 {
		cmd = "runuser -u postgres -- " + cmd
	}
	return cmd
}
