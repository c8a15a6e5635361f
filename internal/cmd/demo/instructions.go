package main

import (
	"fmt"
	"io"
	"strconv"
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

Fail over from pg1 to pg2: in one terminal watch the primary,
  watch -n1 %[9]s+short primary.prod.%[1]s
and in another promote pg2 (one statement, so two primaries are never seen):
  %[5]s -c "UPDATE pgcluster_nodes SET role = CASE name WHEN 'pg2' THEN 'primary' ELSE 'standby' END WHERE cluster = 'local'"
Take a node out of the answers, and bring it back:
  %[5]s -c "UPDATE pgcluster_nodes SET healthy = false WHERE cluster = 'local' AND name = 'pg3'"
  %[5]s -c "UPDATE pgcluster_nodes SET healthy = true WHERE cluster = 'local' AND name = 'pg3'"
Look at the registry:
  %[5]s -c "TABLE pgcluster_nodes" -c "TABLE pgcluster_aliases"

Ctrl-C stops CoreDNS and PostgreSQL and removes %[10]s.

`, zone, o.port, pid, conf, psql, o.metrics, o.ready, answer, dig, tmp)
}
