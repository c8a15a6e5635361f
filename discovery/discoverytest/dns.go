// Package discoverytest provides what tests of cluster discovery need, all
// on loopback: a DNS server publishing clusters the way pgcluster does, a
// stand-in PostgreSQL that answers the SSLRequest, a listener that never
// answers, and a proxy that delays a server's first reply.
package discoverytest

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
)

// Server is an authoritative DNS server for one zone on 127.0.0.1, UDP and
// TCP on the same port. Its clusters and aliases can be changed while it
// runs, and it can be stopped and started again on the same port.
type Server struct {
	// Addr is the server's "127.0.0.1:port".
	Addr string

	tb      TB
	zone    *zone
	queries atomic.Int64

	// rotate turns the start of an answer that does not fit, one step
	// per query.
	rotate atomic.Uint32

	mu       sync.Mutex
	udp, tcp *dns.Server
	silent   bool
	truncate bool
	tcOnTCP  bool
}

// NewServer starts a server for zone (for example "pgcluster.lan") with a
// TTL of 30 seconds and no cluster. It is stopped when the test ends.
func NewServer(tb TB, zone string) *Server {
	tb.Helper()
	s := &Server{tb: tb, zone: newZone(zone)}
	var err error
	for range 20 {
		var pc net.PacketConn
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			continue
		}
		var ln net.Listener
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err != nil {
			pc.Close() // that port is taken over TCP: try another
			continue
		}
		s.Addr = pc.LocalAddr().String()
		s.serve(pc, ln)
		tb.Cleanup(s.Stop)
		return s
	}
	tb.Fatalf("discoverytest: no free port for a DNS server: %v", err)
	return nil
}

// Stop stops the server; queries then fail with "connection refused".
func (s *Server) Stop() {
	s.mu.Lock()
	udp, tcp := s.udp, s.tcp
	s.udp, s.tcp = nil, nil
	s.mu.Unlock()
	if udp != nil {
		udp.Shutdown()
		tcp.Shutdown()
	}
}

// Start starts a stopped server again on the same port.
func (s *Server) Start() {
	s.tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		pc, err := net.ListenPacket("udp", s.Addr)
		if err == nil {
			ln, err2 := net.Listen("tcp", s.Addr)
			if err2 == nil {
				s.serve(pc, ln)
				return
			}
			pc.Close()
			err = err2
		}
		if time.Now().After(deadline) {
			s.tb.Fatalf("discoverytest: restart DNS server on %s: %v", s.Addr, err)
		}
		time.Sleep(10 * time.Millisecond) // the port is still being released
	}
}

func (s *Server) serve(pc net.PacketConn, ln net.Listener) {
	udpUp, tcpUp := make(chan struct{}), make(chan struct{})
	udp := &dns.Server{PacketConn: pc, Handler: s, NotifyStartedFunc: func() { close(udpUp) }}
	tcp := &dns.Server{Listener: ln, Handler: s, NotifyStartedFunc: func() { close(tcpUp) }}
	go udp.ActivateAndServe()
	go tcp.ActivateAndServe()
	<-udpUp
	<-tcpUp
	s.mu.Lock()
	s.udp, s.tcp = udp, tcp
	s.mu.Unlock()
}

// SetCluster publishes cluster with nodes, replacing what it had; no node
// removes the cluster.
func (s *Server) SetCluster(cluster string, nodes ...Node) { s.zone.setCluster(cluster, nodes) }

// SetAlias makes alias a CNAME to target (a cluster or another alias),
// and label.alias a CNAME to label.target; an empty target removes it.
func (s *Server) SetAlias(alias, target string) { s.zone.setAlias(alias, target) }

// HoldPrimary makes primary.CLUSTER keep naming n, a node that has left
// the cluster's answer, while no node of the cluster is primary, with the
// TXT record saying so ("state=held", "node=NAME"), as pgcluster does for
// a bounded time after the primary's check fails. A cluster with one
// primary again names it; ReleasePrimary ends the hold.
func (s *Server) HoldPrimary(cluster string, n Node) { s.zone.hold(cluster, &n) }

// ReleasePrimary ends HoldPrimary: with no primary, primary.CLUSTER has no
// address and its TXT record says "state=none".
func (s *Server) ReleasePrimary(cluster string) { s.zone.hold(cluster, nil) }

// SetStateTXT tells whether primary.CLUSTER carries the TXT record of the
// primary's state (the default), as pgcluster does: "state=serving" and
// "node=NAME" with one primary, "state=held" and "node=NAME" while
// HoldPrimary holds a node, "state=none" with none, "state=split_brain"
// and "primaries=N" when N nodes claim to be primary. Off, the zone is
// that of a pgcluster older than the record.
func (s *Server) SetStateTXT(on bool) { s.zone.setState(on) }

// SetTTL sets the TTL of every record, and the negative-caching TTL.
func (s *Server) SetTTL(ttl uint32) { s.zone.setTTL(ttl) }

// SetRecords publishes records given in zone-file syntax, relative names
// completed with the zone, in addition to the clusters' records.
func (s *Server) SetRecords(records ...string) {
	s.tb.Helper()
	rrs := make([]dns.RR, 0, len(records))
	for _, r := range records {
		rr, err := dns.NewRR("$ORIGIN " + s.zone.origin + "\n" + r)
		if err != nil {
			s.tb.Fatalf("discoverytest: record %q: %v", r, err)
		}
		rrs = append(rrs, rr)
	}
	s.zone.setExtra(rrs)
}

// SetChase tells whether a CNAME answer carries the target's records too,
// as an authoritative server does for names in its zone (the default).
func (s *Server) SetChase(on bool) { s.zone.setChase(on) }

// SetSilent makes the server drop every query (true) or answer again.
func (s *Server) SetSilent(on bool) {
	s.mu.Lock()
	s.silent = on
	s.mu.Unlock()
}

// SetTruncate makes every UDP answer empty and truncated, so clients must
// ask again over TCP.
func (s *Server) SetTruncate(on bool) {
	s.mu.Lock()
	s.truncate = on
	s.mu.Unlock()
}

// SetGlue tells whether SRV answers carry the targets' A and AAAA records
// in the additional section (the default), as pgcluster's do.
func (s *Server) SetGlue(on bool) { s.zone.setGlue(on) }

// SetTCOverTCP makes a TCP answer that had to leave records out carry the
// TC bit, as a server that truncates like dns.Msg.Truncate does; by
// default only UDP answers do, as pgcluster's.
func (s *Server) SetTCOverTCP(on bool) {
	s.mu.Lock()
	s.tcOnTCP = on
	s.mu.Unlock()
}

// Queries returns how many queries the server received.
func (s *Server) Queries() int64 { return s.queries.Load() }

// ServeDNS answers a query from the zone. An answer too big for the
// client's buffer (its EDNS0 size or 512 bytes over UDP, 65,535 bytes over
// TCP) holds as many records of its set as fit, with their glue, starting
// one record further along on each query, as pgcluster's do; over UDP it
// carries the TC bit.
func (s *Server) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	s.queries.Add(1)
	s.mu.Lock()
	silent, truncate, tcOnTCP := s.silent, s.truncate, s.tcOnTCP
	s.mu.Unlock()
	if silent || len(r.Question) != 1 {
		return
	}
	m := s.zone.answer(r)
	_, udp := w.RemoteAddr().(*net.UDPAddr)
	if udp && truncate {
		m.Truncated = true
		m.Answer, m.Ns, m.Extra = nil, nil, nil
	}
	size := dns.MaxMsgSize
	if udp {
		size = dns.MinMsgSize
		if opt := r.IsEdns0(); opt != nil {
			size = max(size, int(opt.UDPSize()))
		}
	}
	if fit(m, size, s.rotate.Add(1)) && (udp || tcOnTCP) {
		m.Truncated = true
	}
	w.WriteMsg(m)
}
