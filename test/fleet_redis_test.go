package test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/redis/go-redis/v9"

	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// fleetBackend is a node of a fleet test (coretest.Backend), on an address
// of its own (so that answers tell the nodes apart), by host and port as
// the registry rows write them.
type fleetBackend struct {
	*coretest.Backend
	host, port string
}

func openFleetBackend(t testing.TB, host string) *fleetBackend {
	t.Helper()
	b := coretest.NewBackend(t, host)
	return &fleetBackend{Backend: b, host: host, port: strconv.Itoa(b.Port)}
}

// fleetOptions are a fleet test's check options.
type fleetOptions struct {
	interval, timeout time.Duration
	backends          int
	redisURL          string
	extra             []string // more pgcluster options
}

// fleet is a registry of backends and the Corefile of instances sharing
// their checks through Redis.
type fleet struct {
	reg      *pgtest.Postgres
	backends []*fleetBackend
	opts     fleetOptions
}

// newFleet registers opts.backends backends at 127.0.0.31… in cluster
// "local".
func newFleet(t testing.TB, opts fleetOptions) *fleet {
	t.Helper()
	f := &fleet{reg: Registry(t), opts: opts}
	var rows []string
	for i := range opts.backends {
		b := openFleetBackend(t, fmt.Sprintf("127.0.0.%d", 31+i))
		f.backends = append(f.backends, b)
		rows = append(rows, fmt.Sprintf("('local', 'n%d', '%s', %s, 'standby')", i, b.host, b.port))
	}
	f.reg.MustExec(t, "INSERT INTO pgcluster_nodes(cluster, name, address, port, role) VALUES "+strings.Join(rows, ", "))
	return f
}

func (f *fleet) corefile(redisURL string) string {
	opts := append([]string{
		"postgres " + f.reg.DSN(""),
		"allow_loopback",
		"check tcp",
		"interval " + f.opts.interval.String(),
		"timeout " + f.opts.timeout.String(),
		"rise 1",
		"fall 1",
		"redis " + redisURL,
	}, f.opts.extra...)
	return fmt.Sprintf("%s:%s {\n bind 127.0.0.1\n prometheus 127.0.0.1:%s\n pgcluster {\n  %s\n }\n}\n",
		Zone, PortPlaceholder, MetricsPlaceholder, strings.Join(opts, "\n  "))
}

func (f *fleet) hosts(except ...int) []string {
	var out []string
	for i, b := range f.backends {
		if !slices.Contains(except, i) {
			out = append(out, b.host)
		}
	}
	return out
}

// startInstances starts n fleet instances with corefile.
func startInstances(t testing.TB, corefile string, n int) []*Instance {
	t.Helper()
	var ins []*Instance
	for range n {
		ins = append(ins, StartFleetInstance(t, corefile))
	}
	return ins
}

// answers returns the addresses an instance answers for local.<zone>.
func answers(in *Instance) ([]string, error) {
	m, err := Exchange("udp", in.Addr(), "local."+Zone, dns.TypeA)
	if err != nil {
		return nil, err
	}
	if m.Rcode != dns.RcodeSuccess {
		return nil, fmt.Errorf("local.%s from %s: %s", Zone, in.Addr(), dns.RcodeToString[m.Rcode])
	}
	return Addrs(m), nil
}

// answersExactly checks that every instance answers exactly hosts.
func answersExactly(ins []*Instance, hosts []string) func() error {
	want := slices.Sorted(slices.Values(hosts))
	return func() error {
		for _, in := range ins {
			got, err := answers(in)
			if err != nil {
				return err
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("%s answers %v, want %v", in.Addr(), got, want)
			}
		}
		return nil
	}
}

// metric reads one sample of an instance's metrics ("name{labels}").
func metric(t testing.TB, in *Instance, name string) float64 {
	t.Helper()
	body, err := get(in.MetricsURL())
	if err != nil {
		t.Fatalf("metrics of %s: %v", in.Addr(), err)
	}
	v, _ := metricValue(body, name)
	return v
}

// memberToken reads an instance's token from its redis_member_info metric.
func memberToken(t testing.TB, in *Instance) string {
	t.Helper()
	body, err := get(in.MetricsURL())
	if err != nil {
		t.Fatalf("metrics of %s: %v", in.Addr(), err)
	}
	m := regexp.MustCompile(`coredns_pgcluster_redis_member_info\{member="([0-9a-f]+)",zone="` + regexp.QuoteMeta(Zone) + `"\} 1`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("%s exports no coredns_pgcluster_redis_member_info", in.Addr())
	}
	return m[1]
}

func fleetMetric(name string) string { return name + `{zone="` + Zone + `"}` }

var (
	modeCoordinated = `coredns_pgcluster_redis_mode{mode="coordinated",zone="` + Zone + `"}`
	modeLocal       = `coredns_pgcluster_redis_mode{mode="local",zone="` + Zone + `"}`
	leasesMetric    = fleetMetric("coredns_pgcluster_redis_leases")
	fencedMetric    = `coredns_pgcluster_redis_writes_total{result="fenced",zone="` + Zone + `"}`
	storedMetric    = `coredns_pgcluster_redis_writes_total{result="stored",zone="` + Zone + `"}`
	extendedMetric  = `coredns_pgcluster_redis_lease_extensions_total{result="extended",zone="` + Zone + `"}`
)

// coordinated checks that every instance is coordinated and that the
// leases they hold add up to n.
func coordinated(t testing.TB, ins []*Instance, n int) func() error {
	return func() error {
		total := 0.0
		for _, in := range ins {
			if metric(t, in, modeCoordinated) != 1 {
				return fmt.Errorf("%s is not coordinated", in.Addr())
			}
			total += metric(t, in, leasesMetric)
		}
		if int(total) != n {
			return fmt.Errorf("%v leases held, want %d", total, n)
		}
		return nil
	}
}

// dropSpread closes backend i and returns, for each instance, when it
// stopped answering it (polled every millisecond).
func (f *fleet) dropTimes(t testing.TB, ins []*Instance, i int, down bool) []time.Time {
	t.Helper()
	host := f.backends[i].host
	times := make([]time.Time, len(ins))
	var wg sync.WaitGroup
	deadline := time.Now().Add(15 * time.Second)
	for k, in := range ins {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				got, err := answers(in)
				if err == nil && slices.Contains(got, host) != down {
					times[k] = time.Now()
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	// The watchers are polling before the change.
	time.Sleep(5 * time.Millisecond)
	if down {
		f.backends[i].Close()
	} else {
		f.backends[i].Open(t)
	}
	wg.Wait()
	for k, tm := range times {
		if tm.IsZero() {
			t.Fatalf("instance %d did not see backend %d go %s within 15s", k, i, map[bool]string{true: "down", false: "up"}[down])
		}
	}
	return times
}

// neverAnswers polls an instance from its start until it has answered for
// two seconds, failing if any answer holds host; it returns how many
// answers it checked.
func neverAnswers(t testing.TB, in *Instance, host string) int {
	t.Helper()
	return pollAnswers(t, in, func(n int, got []string) {
		if slices.Contains(got, host) {
			t.Fatalf("answer %d of an instance started while %s is down holds it: %v", n, host, got)
		}
	})
}

// pollAnswers polls an instance from its start until it has answered for
// two seconds (within fleetReadyTimeout), handing each answer, numbered
// from 1, to check; it returns how many answers it checked.
func pollAnswers(t testing.TB, in *Instance, check func(n int, got []string)) int {
	t.Helper()
	deadline := time.Now().Add(fleetReadyTimeout)
	var first time.Time
	n := 0
	for time.Now().Before(deadline) && (first.IsZero() || time.Since(first) < 2*time.Second) {
		got, err := answers(in)
		if err != nil {
			time.Sleep(time.Millisecond)
			continue
		}
		if first.IsZero() {
			first = time.Now()
		}
		n++
		check(n, got)
	}
	return n
}

func spread(times []time.Time) time.Duration {
	lo, hi := times[0], times[0]
	for _, tm := range times {
		if tm.Before(lo) {
			lo = tm
		}
		if tm.After(hi) {
			hi = tm
		}
	}
	return hi.Sub(lo)
}

// maxGap is the longest time between consecutive probes of b in [from, to).
func maxGap(b *fleetBackend, from, to time.Time) time.Duration {
	ps := b.AcceptsIn(from, to)
	prev, gap := from, time.Duration(0)
	for _, p := range ps {
		gap = max(gap, p.Sub(prev))
		prev = p
	}
	return max(gap, to.Sub(prev))
}

// A fleet of three bin/coredns processes shares the checks of six backends
// through a real Redis: each backend is probed by one instance, a flip
// reaches all three, a SIGKILLed instance's backends are taken over, a new
// instance started while a backend is down never answers it, and a holder
// frozen past its lease cannot write over its successor.
func TestFleetRedis(t *testing.T) {
	const interval, timeout = 200 * time.Millisecond, 100 * time.Millisecond
	rs := redistest.Start(t)
	f := newFleet(t, fleetOptions{interval: interval, timeout: timeout, backends: 6})
	corefile := f.corefile(rs.URL())
	ins := startInstances(t, corefile, 3)
	Eventually(t, 20*time.Second, answersExactly(ins, f.hosts()))
	Eventually(t, 20*time.Second, coordinated(t, ins, len(f.backends)))

	// Each instance exports its token, and the check leases in Redis are
	// held by those tokens, as many each as the instance says it holds.
	// The registry lease is held by one of them too: an instance has one
	// token, for its checks and its registry relay alike.
	rdb := redis.NewClient(&redis.Options{Addr: rs.Addr()})
	defer rdb.Close()
	held := map[string]int{}
	registryHolder := ""
	keys, err := rdb.Keys(context.Background(), "*:lease").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		holder, err := rdb.Get(context.Background(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(k, "{registry}:lease") {
			registryHolder = holder
			continue
		}
		held[holder]++
	}
	tokens := map[string]bool{}
	for _, in := range ins {
		token := memberToken(t, in)
		tokens[token] = true
		if got, want := held[token], int(metric(t, in, leasesMetric)); got != want {
			t.Errorf("%s (member %s): %d leases in Redis, the instance says %d (all: %v)", in.Addr(), token, got, want, held)
		}
	}
	if !tokens[registryHolder] {
		t.Errorf("the registry lease is held by %q, not by a member's token (%v)", registryHolder, tokens)
	}

	// One prober per backend: about one probe per interval, not three.
	// And its verdicts unchanged, a holder does not write them at every
	// probe: it extends the leases between its rewrites (every five
	// intervals).
	stored := map[*Instance]float64{}
	for _, in := range ins {
		stored[in] = metric(t, in, storedMetric)
	}
	from := time.Now()
	time.Sleep(3 * time.Second) // a measurement window
	to := time.Now()
	for _, in := range ins {
		leases := metric(t, in, leasesMetric)
		writes, extended := metric(t, in, storedMetric)-stored[in], metric(t, in, extendedMetric)
		t.Logf("%s: %v leases, %v unchanged statuses stored in %v, %v leases extended in all", in.Addr(), leases, writes, to.Sub(from).Round(time.Millisecond), extended)
		if perProbe := writes / (leases * float64(to.Sub(from)/interval)); leases > 0 && (extended == 0 || perProbe > 0.5) {
			t.Errorf("%s holds %v leases: %v unchanged statuses stored in %v (%.2f per probe), %v leases extended: rewritten at probes", in.Addr(), leases, writes, to.Sub(from).Round(time.Millisecond), perProbe, extended)
		}
	}
	single := float64(to.Sub(from) / interval)
	for i, b := range f.backends {
		n := float64(len(b.AcceptsIn(from, to)))
		t.Logf("backend %d: %v probes in %v (one prober: %v)", i, n, to.Sub(from).Round(time.Millisecond), single)
		if n > 1.6*single || n < 0.5*single {
			t.Errorf("backend %d probed %v times in %v; one prober makes %v", i, n, to.Sub(from), single)
		}
	}

	// A flip reaches every instance.
	down := f.dropTimes(t, ins, 0, true)
	up := f.dropTimes(t, ins, 0, false)
	t.Logf("flip spread between instances: down %v, up %v", spread(down), spread(up))

	// Cold start while backend 1 is down: the new instance never answers it.
	f.backends[1].Close()
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts(1)))
	late := StartFleetInstanceNoWait(t, corefile)
	if n := neverAnswers(t, late, f.backends[1].host); n == 0 {
		t.Fatal("the late instance never answered")
	}
	ins = append(ins, late)
	f.backends[1].Open(t)
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts()))
	Eventually(t, 20*time.Second, coordinated(t, ins, len(f.backends)))

	// SIGKILL the instance holding the most leases: the others take its
	// backends over; none goes unprobed longer than a lease and an interval.
	victim := 0
	for k, in := range ins {
		if metric(t, in, leasesMetric) > metric(t, ins[victim], leasesMetric) {
			victim = k
		}
	}
	killed := time.Now()
	ins[victim].Kill()
	rest := slices.Delete(slices.Clone(ins), victim, victim+1)
	Eventually(t, 20*time.Second, coordinated(t, rest, len(f.backends)))
	ttl := max(3*interval+timeout, time.Second)
	for i, b := range f.backends {
		g := maxGap(b, killed.Add(-interval), time.Now())
		t.Logf("backend %d: longest gap between probes around the kill %v (lease %v + interval %v)", i, g.Round(time.Millisecond), ttl, interval)
		if g > ttl+interval+time.Second {
			t.Errorf("backend %d unprobed for %v after a SIGKILL; lease %v + interval %v", i, g, ttl, interval)
		}
	}
	f.backends[2].Close()
	Eventually(t, 10*time.Second, answersExactly(rest, f.hosts(2)))
	f.backends[2].Open(t)
	Eventually(t, 10*time.Second, answersExactly(rest, f.hosts()))

	// A holder frozen past its lease, then resumed, cannot write: its
	// fenced writes are refused while the others hold its backends.
	holder := rest[0]
	before := metric(t, holder, fencedMetric)
	holder.Freeze()
	others := rest[1:]
	Eventually(t, 20*time.Second, coordinated(t, others, len(f.backends)))
	f.backends[3].Close() // a change only the new holders see
	Eventually(t, 10*time.Second, answersExactly(others, f.hosts(3)))
	holder.Thaw()
	Eventually(t, 20*time.Second, coordinated(t, rest, len(f.backends)))
	Eventually(t, 10*time.Second, answersExactly(rest, f.hosts(3)))
	t.Logf("fenced writes of the thawed holder: %v", metric(t, holder, fencedMetric)-before)
}

// answering checks that every instance answers local.<zone> without error
// and fast, many times over, while something else happens: no SERVFAIL and
// no answer held up by a Redis call. It returns the slowest answer.
func keepAnswering(t testing.TB, ins []*Instance, stop <-chan struct{}) func() time.Duration {
	var (
		mu      sync.Mutex
		slowest time.Duration
		fails   []string
		wg      sync.WaitGroup
	)
	for _, in := range ins {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				_, err := answers(in)
				d := time.Since(start)
				mu.Lock()
				slowest = max(slowest, d)
				if err != nil && len(fails) < 5 {
					fails = append(fails, err.Error())
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	return func() time.Duration {
		wg.Wait()
		if len(fails) > 0 {
			t.Errorf("answers failed while Redis was away: %v", fails)
		}
		return slowest
	}
}

// Redis stopped, then Redis frozen with SIGSTOP: every instance keeps
// answering, falls back to local checks that still see a flip, and when
// Redis is back coordinates again, one prober per backend.
func TestFleetRedisOutage(t *testing.T) {
	const interval, timeout = 200 * time.Millisecond, 100 * time.Millisecond
	rs := redistest.Start(t)
	f := newFleet(t, fleetOptions{interval: interval, timeout: timeout, backends: 4})
	corefile := f.corefile(rs.URL())
	ins := startInstances(t, corefile, 3)
	Eventually(t, 20*time.Second, coordinated(t, ins, len(f.backends)))
	Eventually(t, 10*time.Second, answersExactly(ins, f.hosts()))

	for _, how := range []string{"stopped", "frozen"} {
		stop := make(chan struct{})
		done := keepAnswering(t, ins, stop)
		if how == "stopped" {
			rs.Stop()
		} else if err := rs.Freeze(); err != nil {
			t.Fatal(err)
		}
		Eventually(t, 10*time.Second, func() error {
			for _, in := range ins {
				if metric(t, in, modeLocal) != 1 {
					return fmt.Errorf("%s not in local mode with Redis %s", in.Addr(), how)
				}
			}
			return nil
		})
		// Local checks still see a flip, in every instance.
		f.backends[0].Close()
		Eventually(t, 10*time.Second, answersExactly(ins, f.hosts(0)))
		f.backends[0].Open(t)
		Eventually(t, 10*time.Second, answersExactly(ins, f.hosts()))
		// Each instance probes every backend itself.
		from := time.Now()
		time.Sleep(time.Second) // a measurement window
		for i, b := range f.backends {
			if n := len(b.AcceptsIn(from, time.Now())); n < 2*int(time.Second/interval) {
				t.Errorf("Redis %s: backend %d probed %d times in 1s by 3 instances in local mode", how, i, n)
			}
		}
		close(stop)
		slowest := done()
		t.Logf("Redis %s: slowest answer %v", how, slowest)
		if slowest > 250*time.Millisecond {
			t.Errorf("Redis %s: an answer took %v (a Redis call on the query path?)", how, slowest)
		}

		// Redis back: coordinated again, one prober per backend.
		if how == "stopped" {
			if err := rs.Start(); err != nil {
				t.Fatal(err)
			}
		} else if err := rs.Thaw(); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		Eventually(t, 20*time.Second, coordinated(t, ins, len(f.backends)))
		t.Logf("Redis %s: coordinated again %v after it came back", how, time.Since(back).Round(time.Millisecond))
		settle := time.Now().Add(2 * interval)
		Eventually(t, 5*time.Second, func() error {
			if time.Now().Before(settle.Add(time.Second)) {
				return fmt.Errorf("measuring")
			}
			return nil
		})
		from, to := settle, settle.Add(time.Second)
		for i, b := range f.backends {
			if n := len(b.AcceptsIn(from, to)); n > int(time.Second/interval)+2 {
				t.Errorf("Redis %s, back: backend %d probed %d times in the second after two intervals, one prober makes %d", how, i, n, time.Second/interval)
			}
		}
		Eventually(t, 10*time.Second, answersExactly(ins, f.hosts()))
	}
}

// An instance started while Redis is down answers from its own checks, and
// joins the fleet when Redis starts.
func TestFleetRedisDownAtStart(t *testing.T) {
	const interval, timeout = 200 * time.Millisecond, 100 * time.Millisecond
	rs := redistest.Start(t)
	f := newFleet(t, fleetOptions{interval: interval, timeout: timeout, backends: 2})
	corefile := f.corefile(rs.URL())
	rs.Stop()
	f.backends[1].Close()
	in := StartFleetInstance(t, corefile)
	Eventually(t, 10*time.Second, answersExactly([]*Instance{in}, f.hosts(1)))
	if metric(t, in, modeLocal) != 1 {
		t.Fatalf("instance started without Redis is not in local mode")
	}
	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 20*time.Second, coordinated(t, []*Instance{in}, len(f.backends)))
	f.backends[1].Open(t)
	Eventually(t, 10*time.Second, answersExactly([]*Instance{in}, f.hosts()))
}
