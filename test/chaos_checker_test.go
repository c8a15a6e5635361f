package test

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// Pace and bound of the chaos checker's queries.
const (
	// chaosRound is how often the checker asks each instance its names.
	chaosRound = 30 * time.Millisecond
	// chaosQueryTimeout: an answer later than this is a timeout, as for
	// dnsperf -t 1.
	chaosQueryTimeout = time.Second
)

// The names the checker asks each instance for, A records each.
var (
	chaosLocal   = "local." + Zone
	chaosPrimary = "primary.pgc." + Zone
	chaosStandby = "standby.pgc." + Zone
	chaosNames   = []string{chaosLocal, chaosPrimary, chaosStandby}
)

// chaosObs is one query of the checker and what came back.
type chaosObs struct {
	inst       int // the incarnation asked (see chaosChecker.watch)
	name       string
	send, recv time.Time
	rcode      int // -1 without an answer
	timeout    bool
	err        error
	addrs      []string
}

// chaosChecker asks every running instance the chaos names many times a
// second and keeps every answer, to be judged once the run is over against
// what the backends and the registry were doing.
type chaosChecker struct {
	mu  sync.Mutex
	obs []chaosObs
	wg  sync.WaitGroup
}

// watch queries the instance at addr, known as incarnation id, until the
// returned function is called (which waits for the last query to end).
func (c *chaosChecker) watch(id int, addr string) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	c.wg.Add(1)
	wg.Go(func() {
		defer c.wg.Done()
		client := &dns.Client{Net: "udp", Timeout: chaosQueryTimeout}
		next := time.Now()
		for {
			for _, name := range chaosNames {
				c.add(ask(client, id, addr, name))
			}
			next = next.Add(chaosRound)
			t := time.NewTimer(time.Until(next))
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C:
			}
		}
	})
	return func() {
		close(done)
		wg.Wait()
	}
}

func ask(client *dns.Client, id int, addr, name string) chaosObs {
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	o := chaosObs{inst: id, name: name, send: time.Now(), rcode: -1}
	r, _, err := client.Exchange(m, addr)
	o.recv = time.Now()
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		o.timeout = true
	case err != nil:
		o.err = err
	default:
		o.rcode = r.Rcode
		o.addrs = Addrs(r)
	}
	return o
}

func (c *chaosChecker) add(o chaosObs) {
	c.mu.Lock()
	c.obs = append(c.obs, o)
	c.mu.Unlock()
}

// all returns every observation so far.
func (c *chaosChecker) all() []chaosObs {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.obs)
}

// chaosVerdict is the checker's count of what went wrong.
type chaosVerdict struct {
	total, servfail, otherRcode, timeouts, errs int
	// staleBackend: an address answered after its backend had been down
	// longer than the budget; missingBackend: a backend up longer than
	// the budget left out; wrongRole: a primary. or standby. answer that
	// is not exactly the node holding that role (within the budget).
	staleBackend, missingBackend, wrongRole int
	// switchNoData: primary. answered without an address during a planned
	// switchover (with check postgres), counted apart from the wrong ones.
	switchNoData int
	// examples holds the first few queries of each kind that went wrong.
	examples map[string][]string
	slowest  time.Duration
}

func (v chaosVerdict) wrong() int { return v.staleBackend + v.missingBackend + v.wrongRole }

// chaosExamples is how many queries of each kind that went wrong the
// report shows.
const chaosExamples = 6

func (v *chaosVerdict) example(kind string, o chaosObs, format string, args ...any) {
	if v.examples == nil {
		v.examples = map[string][]string{}
	}
	if len(v.examples[kind]) < chaosExamples {
		v.examples[kind] = append(v.examples[kind], fmt.Sprintf("%s incarnation %d %s (+%v): ",
			o.send.Format("15:04:05.000"), o.inst, o.name, o.recv.Sub(o.send).Round(time.Microsecond))+fmt.Sprintf(format, args...))
	}
}

// judge counts what went wrong in obs: answers that are not NOERROR,
// timeouts, and wrong answers, against backends and roles, allowing budget
// for a change to reach an answer.
func judgeChaos(obs []chaosObs, backends []*chaosBackend, roles chaosRoleBook, budget time.Duration) chaosVerdict {
	var v chaosVerdict
	for _, o := range obs {
		v.total++
		v.slowest = max(v.slowest, o.recv.Sub(o.send))
		switch {
		case o.timeout:
			v.timeouts++
			v.example("timeout", o, "timeout")
			continue
		case o.err != nil:
			v.errs++
			v.example("error", o, "%v", o.err)
			continue
		case o.rcode == dns.RcodeServerFailure:
			v.servfail++
			v.example("SERVFAIL", o, "SERVFAIL")
			continue
		case o.rcode != dns.RcodeSuccess:
			v.otherRcode++
			v.example("rcode", o, "%s", dns.RcodeToString[o.rcode])
			continue
		}
		switch o.name {
		case chaosLocal:
			judgeLocal(&v, o, backends, budget)
		case chaosPrimary:
			judgeRole(&v, o, roles, "primary", budget)
		case chaosStandby:
			judgeRole(&v, o, roles, "standby", budget)
		}
	}
	return v
}

// judgeLocal: an address whose backend had been down for longer than
// budget when the query was sent is stale; a backend that had been up for
// longer than budget then, and stayed up until the answer came, is missing
// if left out.
func judgeLocal(v *chaosVerdict, o chaosObs, backends []*chaosBackend, budget time.Duration) {
	for _, b := range backends {
		up, since := b.stateAt(o.send)
		in := slices.Contains(o.addrs, b.host)
		long := o.send.Sub(since) > budget
		switch {
		case in && !up && long:
			v.staleBackend++
			v.example("stale backend", o, "answers %s, down for %v (budget %v): %v", b.host, o.send.Sub(since).Round(time.Millisecond), budget, o.addrs)
		case !in && up && long && !b.changedIn(o.send, o.recv):
			v.missingBackend++
			v.example("missing backend", o, "leaves out %s, up for %v (budget %v): %v", b.host, o.send.Sub(since).Round(time.Millisecond), budget, o.addrs)
		}
	}
}

// judgeRole: the answer must be one address, of the node that held role
// at some time from budget before the query to its answer, or none when
// no node held it at some time then. primary. without an address during
// a planned switchover is counted apart.
func judgeRole(v *chaosVerdict, o chaosObs, roles chaosRoleBook, role string, budget time.Duration) {
	from := o.send.Add(-budget)
	switch {
	case len(o.addrs) == 0 && role == "primary" && roles.switching(o.send):
		v.switchNoData++
		v.example("NODATA during a switchover", o, "no address for the primary")
	case len(o.addrs) == 0 && roles.vacant(role, from, o.recv):
	case len(o.addrs) != 1 || !roles.holds(o.addrs[0], role, from, o.recv):
		v.wrongRole++
		v.example("wrong role", o, "answers %v, not the %s", o.addrs, role)
	}
}

// propagation measures how long changes took to leave the answers: for
// each backend going down, and each instance asked meanwhile, the last
// query sent while it was down whose answer still held it; for each time
// the primary role left a node (a swap's COMMIT; with check postgres, the
// end of the old primary's stop), the last query sent after it, and before
// that node may be primary again, whose primary. answer was that node. It
// returns every such delay, sorted (0 when no answer after the change held
// the old state).
func propagation(obs []chaosObs, backends []*chaosBackend, roles chaosRoleBook) (down, swap []time.Duration) {
	for _, b := range backends {
		from, to := b.downs()
		for i := range from {
			last := map[int]time.Duration{}
			for _, o := range obs {
				if o.name != chaosLocal || o.send.Before(from[i]) || (!to[i].IsZero() && !o.send.Before(to[i])) {
					continue
				}
				if _, ok := last[o.inst]; !ok {
					last[o.inst] = 0
				}
				if slices.Contains(o.addrs, b.host) {
					last[o.inst] = max(last[o.inst], o.send.Sub(from[i]))
				}
			}
			for _, d := range last {
				down = append(down, d)
			}
		}
	}
	at, old, next := roles.changes()
	for i := range at {
		last := map[int]time.Duration{}
		for _, o := range obs {
			if o.name != chaosPrimary || o.send.Before(at[i]) || (!next[i].IsZero() && !o.send.Before(next[i])) {
				continue
			}
			if _, ok := last[o.inst]; !ok {
				last[o.inst] = 0
			}
			if slices.Contains(o.addrs, old[i]) {
				last[o.inst] = max(last[o.inst], o.send.Sub(at[i]))
			}
		}
		for _, d := range last {
			swap = append(swap, d)
		}
	}
	sort.Slice(down, func(i, j int) bool { return down[i] < down[j] })
	sort.Slice(swap, func(i, j int) bool { return swap[i] < swap[j] })
	return down, swap
}

// slowestIn returns the longest query of obs sent in [from, to).
func slowestIn(obs []chaosObs, from, to time.Time) time.Duration {
	var d time.Duration
	for _, o := range obs {
		if !o.send.Before(from) && o.send.Before(to) {
			d = max(d, o.recv.Sub(o.send))
		}
	}
	return d
}

// slowestQueries returns the n slowest queries of obs, slowest first.
func slowestQueries(obs []chaosObs, n int) []chaosObs {
	s := slices.Clone(obs)
	sort.Slice(s, func(i, j int) bool { return s[i].recv.Sub(s[i].send) > s[j].recv.Sub(s[j].send) })
	return s[:min(n, len(s))]
}

// latencyQuantile returns the q quantile of the time obs took to answer.
func latencyQuantile(obs []chaosObs, q float64) time.Duration {
	ds := make([]time.Duration, len(obs))
	for i, o := range obs {
		ds[i] = o.recv.Sub(o.send)
	}
	slices.Sort(ds)
	if len(ds) == 0 {
		return 0
	}
	return ds[int(q*float64(len(ds)-1))]
}

// chaosStallTick is the period of the stall meter, and chaosStall how
// late one of its ticks must be to count as a stall of the host.
const (
	chaosStallTick = 10 * time.Millisecond
	chaosStall     = 200 * time.Millisecond
)

// stallMeter measures how late a timer of the test process fires: when
// the host is so loaded that this process is not scheduled, queries time
// out for the same reason, whatever the instances do.
type stallMeter struct {
	mu     sync.Mutex
	stalls []chaosStallAt
	stop   chan struct{}
	done   chan struct{}
}

// chaosStallAt is a tick late by more than chaosStall.
type chaosStallAt struct {
	at   time.Time // when it was due
	late time.Duration
}

func startStallMeter() *stallMeter {
	m := &stallMeter{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		t := time.NewTicker(chaosStallTick)
		defer t.Stop()
		due := time.Now().Add(chaosStallTick)
		for {
			select {
			case <-m.stop:
				return
			case now := <-t.C:
				if late := now.Sub(due); late > chaosStall {
					m.mu.Lock()
					m.stalls = append(m.stalls, chaosStallAt{due, late})
					m.mu.Unlock()
				}
				due = now.Add(chaosStallTick)
			}
		}
	}()
	return m
}

// end stops the meter and returns the stalls, in time order.
func (m *stallMeter) end() []chaosStallAt {
	close(m.stop)
	<-m.done
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.stalls)
}
