package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pgcluster/pgcluster/internal/pgtest"
)

// instructions prints where the demo runs and what to try.
func instructions(w io.Writer, d *demo) {
	in := d.fleet[0]
	dig := "dig @127.0.0.1 -p " + in.port() + " "
	psql := "psql '" + d.dsn + "'"
	var servers []string
	fmt.Fprintf(w, "\npgcluster demo is up: %d CoreDNS instances sharing their checks through Redis.\n\n", len(d.fleet))
	fmt.Fprintf(w, "  zone      %s.\n", zone)
	for _, in := range d.fleet {
		fmt.Fprintf(w, "  %s %s  pid %d  metrics %s  ready http://%s/ready\n", in.name, in.Addr(), in.Pid(), in.MetricsURL(), in.readyAddr())
		servers = append(servers, in.Addr())
	}
	fmt.Fprintf(w, "  Corefile  %s (the others' differ only in their ports)\n", in.conf)
	var nodes []string
	for _, n := range d.rows {
		nodes = append(nodes, n.name+" "+net.JoinHostPort(n.address, strconv.Itoa(n.port))+" "+n.role+" (zone "+n.zone+")")
	}
	fmt.Fprintf(w, "  nodes     %s\n", strings.Join(nodes, ", "))
	fmt.Fprintf(w, "  redis     %s  (redis-server pid %d)\n", d.redis.URL(), d.redis.Pid())
	fmt.Fprintf(w, "  registry  %s\n", psql)
	if d.settleErr != nil {
		fmt.Fprintf(w, "  fleet     %s: not settled yet (%v)\n", describe(d.states), d.settleErr)
	} else {
		fmt.Fprintf(w, "  fleet     %s: each node probed by one instance\n", describe(d.states))
	}
	fmt.Fprintf(w, "\nprod.%s answers: %s\n\nAsk any instance: they answer the same.\n", zone, d.answer)
	for _, in := range d.fleet {
		fmt.Fprintf(w, "  dig @127.0.0.1 -p %s prod.%s\n", in.port(), zone)
	}
	fmt.Fprintf(w, "\nThe instances order answers by where the client is (topology prefer): a client\nin zone a's network gets pg1 first, one in zone b's pg2 and pg3 first. Ask as each:\n")
	for _, nw := range demoNetworks {
		fmt.Fprintf(w, "  %sprod.%s +subnet=%s    # zone %s\n", dig, zone, zoneSubnet(nw[0]), nw[1])
	}
	fmt.Fprintf(w, "  %sTXT _client.%s +subnet=%s    # where the instance places you\n", dig, zone, zoneSubnet(demoNetworks[0][0]))
	fmt.Fprintf(w, `Try:
  %[1]smyapp-db.%[2]s
  %[1]sprimary.prod.%[2]s
  %[1]sstandby.local.%[2]s
  %[1]sSRV _postgresql._tcp.local.%[2]s
  %[1]sTXT pg2.local.%[2]s

Each node is a real PostgreSQL server on its own address. Find the fastest,
and follow the topology as it changes (the instances in failover order):
  bin/pgdiscover -dns %[3]s -v prod.%[2]s
  bin/pgdiscover -dns %[3]s -watch -v primary.prod.%[2]s
  psql "postgres://postgres@$(bin/pgdiscover -dns %[3]s primary.prod.%[2]s)/postgres" -c 'SELECT inet_server_addr(), inet_server_port()'

Take a node out of the answers through the registry, and bring it back:
  %[4]s -c "UPDATE pgcluster_nodes SET healthy = false WHERE cluster = 'local' AND name = 'pg3'"
  %[4]s -c "UPDATE pgcluster_nodes SET healthy = true WHERE cluster = 'local' AND name = 'pg3'"
Drain a node for maintenance (out of every shared name, its own name kept,
back by itself after 10 minutes), list the drains, and undrain it:
  %[5]s drain -postgres '%[6]s' -cluster local -node pg3 -reason "demo maintenance" -for 10m
  %[5]s drains -postgres '%[6]s'
  %[5]s undrain -postgres '%[6]s' -cluster local -node pg3
Look at the registry:
  %[4]s -c "TABLE pgcluster_nodes" -c "TABLE pgcluster_aliases"

`, dig, zone, strings.Join(servers, ","), psql, "bin/pgclusterctl", d.dsn)
}

// fleetLoop is a shell loop running cmd once per instance of the fleet,
// each output line prefixed with the instance's name: in cmd, $p is the
// port that port returns for the instance.
func fleetLoop(d *demo, port func(*instance) string, cmd string) string {
	var items []string
	for _, in := range d.fleet {
		items = append(items, in.name+":"+port(in))
	}
	return "for i in " + strings.Join(items, " ") + "; do p=${i#*:}; " + cmd + " | sed \"s/^/${i%%:*}: /\"; done"
}

// digLoop is a shell loop asking every instance of the fleet for name, one
// line per instance.
func digLoop(d *demo, name string) string {
	return fleetLoop(d, (*instance).port, "echo $(dig @127.0.0.1 -p $p +short "+name+")")
}

// metricsLoop is a shell loop printing each instance's Redis mode and
// leases, each line naming the instance.
func metricsLoop(d *demo) string {
	return fleetLoop(d, (*instance).metricsPort, "curl -s http://127.0.0.1:$p/metrics | grep -E '^coredns_pgcluster_redis_(mode.* 1$|leases)'")
}

// checkInstructions prints what to try with the health checks: stop a node's
// server and watch every instance drop it, fail over for real.
func checkInstructions(w io.Writer, d *demo) {
	pg1, pg2, pg3 := d.nodes["pg1"], d.nodes["pg2"], d.nodes["pg3"]
	if pg1 == nil || pg2 == nil || pg3 == nil {
		return
	}
	fmt.Fprintf(w, `Every node is checked (check postgres) by the one instance holding its lease,
which publishes each verdict through Redis to the others: the role PostgreSQL
reports decides primary. and standby., whatever the registry's role column
says. See every node in or out and why, which instance holds its lease and
which checked it (instances by their token in Redis; exit status 0 while
every cluster has one serving primary):
  %[8]s
Stop pg3's server and watch all three instances drop it at once: the
instance holding its lease keeps a session to it, which the server ends as
it shuts down (without it: fall x interval + timeout, 3 s here):
  watch -n1 '%[1]s'        # or: %[8]s -watch
  %[3]s stop -m fast
  dig @127.0.0.1 -p %[2]s TXT pg3.local.%[4]s    # reason=check_refused
  %[8]s    # pg3: down (refused), out, check_refused
  %[3]s start
Fail over for real: stop the primary pg1, promote pg2, and watch primary.
move within about role_interval (100 ms) of the promotion, never without an
address meanwhile (TXT state=held, then state=serving node=pg2):
  watch -n0.2 '%[5]s'
  %[6]s stop -m fast & %[7]s promote; wait
  dig @127.0.0.1 -p %[2]s TXT primary.local.%[4]s

`, digLoop(d, "local."+zone), d.fleet[len(d.fleet)-1].port(), pgCtl(pg3), zone, digLoop(d, "primary.local."+zone), pgCtl(pg1), pgCtl(pg2),
		"bin/pgclusterctl status -postgres '"+d.dsn+"' -redis "+d.redis.URL()+" -allow-loopback")
}

// redisInstructions prints what to try with Redis: stop or freeze it and
// watch the instances fall back to local checks, bring it back and watch
// them rejoin.
func redisInstructions(w io.Writer, d *demo, demoPid int) {
	modes := metricsLoop(d)
	_, redisPort, _ := strings.Cut(d.redis.Addr(), ":")
	pid := d.redis.Pid()
	fmt.Fprintf(w, `Each instance is coordinated, with its share of the leases:
  %[1]s
Stop Redis, or freeze it, and watch the instances fall back to checking every
node themselves ("Redis does not answer" in their output), answering all the
while; the node loop above still works:
  redis-cli -p %[2]s shutdown nosave        # or: kill -STOP %[3]d
  %[1]s
Bring it back, and watch them rejoin within a second ("rejoining the fleet"):
  kill -USR1 %[4]d                          # the demo starts redis-server again on port %[2]s, and prints its new pid; after kill -STOP: kill -CONT %[3]d
  %[1]s

Ctrl-C stops the fleet, Redis and PostgreSQL and removes %[5]s.

`, modes, redisPort, pid, demoPid, d.tmp)
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

// zoneSubnet is a /24 inside network (a /16 of demoNetworks): the subnet a
// resolver would send for a client there.
func zoneSubnet(network string) string {
	return strings.TrimSuffix(network, ".0.0/16") + ".7.0/24"
}
