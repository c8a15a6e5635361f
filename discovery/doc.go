// Package discovery finds the PostgreSQL nodes of a cluster through the
// cluster's DNS and picks the fastest one.
//
// One name in the application's configuration (for example
// prod.pgcluster.lan) resolves to every serving node. A [Client] asks DNS
// servers directly, or the system's nameservers, follows CNAME chains, reads
// ports from SRV records (_postgresql._tcp.NAME) and keeps the TTL of what it
// was told. It then probes the candidates (the first 32 of a big cluster)
// in parallel within one timeout — a TCP connect, or a PostgreSQL
// SSLRequest round trip that needs no credentials — and ranks the reachable
// ones by latency ("T3": test, try, take the fastest).
//
// A [Watcher] keeps the answer current: it re-resolves when the TTL runs out,
// on a timer, when the caller reports a connection error, and when the answer
// for primary.NAME changes, and reports every node that joins or leaves.
//
// For pgx, [Client.LookupFunc] and [Client.ConfigureConn] make
// postgres://app@prod.pgcluster.lan/db connect to the fastest node without
// the operating system's resolver, and [Client.NewPool] builds a pgxpool
// whose connections to a node that left the answer are closed instead of
// being reused (after a failover, a pooled connection to the demoted primary
// fails every write with SQLSTATE 25006). On the errors of a switchover it
// resolves again at once, then every [MinWatchInterval] while they go on;
// a pool of primary.CLUSTER reads the primary's state that pgcluster
// publishes in TXT between resolutions ([WatchOptions.StateInterval]), and
// finds the new primary itself, with a connection waiting on each serving
// node until one takes writes, while that record says the old one has left
// and no new one is seen ([WatchOptions.ReadWriteFallback]).
//
// The package knows nothing of CoreDNS: it speaks plain DNS and works with
// any server that publishes the same names.
package discovery
