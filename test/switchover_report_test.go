package test

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// The switchover rounds' figures: what each round measured, from what the
// load recorded, and the table a person reads at the end.

type switchoverKind int

const (
	switchoverPlanned switchoverKind = iota
	switchoverUnplanned
	switchoverSplit
	switchoverSplitSync
)

func (k switchoverKind) String() string {
	return [...]string{"planned", "unplanned", "split brain", "split brain, synchronous"}[k]
}

// switchoverRound is one round: its times, and its figures once analysed.
type switchoverRound struct {
	kind     switchoverKind
	n        int
	from, to int       // node indexes, -1 for a round not run
	fault    time.Time // the stop or kill was ordered (split brain: the promotion)
	stopped  time.Time // the old primary was down (pg_ctl stop returned, or its processes ended)
	ordered  time.Time // the promotion was ordered
	promoted time.Time // pg_ctl promote -w returned
	writable time.Time // split brain: the promoted server could take writes from then on
	restored time.Time // the rig was steady again (split brain: the watch ended)
	restore  string    // what became of the other standby
	cause    string    // why the round failed; "" when it completed
	lost     []int     // per writer, writes the old primary acknowledged that the new one lacks
	sessions int       // role sessions the fleet held when the round began, -1 unknown

	writers []switchoverWriterRound // as s.writers
	dns     switchoverDNSRound
}

// switchoverWriterRound is one writer's figures of one round.
type switchoverWriterRound struct {
	ok     bool          // it was acknowledged by the new primary
	outage time.Duration // last acknowledgement before the new primary's first → that first
	beyond time.Duration // promote returned → the new primary's first acknowledgement
	failed int           // attempts that failed, started in the round

	// Split brain: acknowledgements after the promotion returned, by the
	// old and the new primary, and the last one's time after it.
	byOld, byNew int
	last         time.Duration
	// wrong counts the acknowledgements, in attempts begun from the
	// promotion until the next round, by a server that was not the
	// primary of record at any moment of the attempt.
	wrong int
}

// switchoverDNSRound is the pollers' figures of one round.
type switchoverDNSRound struct {
	ok       bool          // every instance named the new primary (split brain: none)
	all      time.Duration // promote returned → the last instance to do so
	answers  int
	nodata   int           // NOERROR without an address
	stale    int           // naming a server that was not the primary of record
	staleFor time.Duration // the old primary down → the last such answer
	failed   int           // timeouts and error rcodes
}

// analyse computes a planned or unplanned round's figures.
func (s *switchoverRun) analyse(res *switchoverRound) {
	if res.fault.IsZero() || res.promoted.IsZero() {
		return
	}
	for _, w := range s.writers {
		res.writers = append(res.writers, switchoverWriterFigures(w.since(res.fault.Add(-5*time.Second)), res))
	}
	res.dns = s.dnsRound(res, func(a switchoverAnswer) bool { return a.nodes == 1<<res.to })
}

// switchoverWriterFigures computes a writer's figures of a round from its
// attempts, which start 5 s before the fault: a round starts once both
// writers write, so the last acknowledgement before the fault is among
// them (were it not, the outage would count from the fault).
func switchoverWriterFigures(as []switchoverAttempt, res *switchoverRound) switchoverWriterRound {
	var wr switchoverWriterRound
	first := slices.IndexFunc(as, func(a switchoverAttempt) bool { return a.node == res.to && a.end.After(res.fault) })
	for _, a := range as {
		if !a.ok() && !a.start.Before(res.fault) && a.start.Before(res.restored) {
			wr.failed++
		}
	}
	if first < 0 {
		return wr
	}
	wr.ok = true
	last := res.fault
	for _, a := range as[:first] {
		if a.ok() {
			last = a.end
		}
	}
	wr.outage = as[first].end.Sub(last)
	wr.beyond = as[first].end.Sub(res.promoted)
	return wr
}

// dnsRound computes the pollers' figures of a round; named says whether
// an answer is the one every instance is to reach.
func (s *switchoverRun) dnsRound(res *switchoverRound, named func(switchoverAnswer) bool) switchoverDNSRound {
	d := switchoverDNSRound{ok: true, all: math.MinInt64}
	down := res.stopped
	if down.IsZero() {
		down = res.ordered
	}
	for _, p := range s.pollers {
		reached := false // d.all is the latest first answer of the instances: negative when all came before promote returned
		for _, a := range p.between(res.fault, res.restored) {
			d.answers++
			switch {
			case a.failed:
				d.failed++
				continue
			case a.nodata:
				d.nodata++
			}
			if !reached && named(a) {
				reached = true
				d.all = max(d.all, a.recv.Sub(res.promoted))
			}
			if s.stale(a) {
				d.stale++
				d.staleFor = max(d.staleFor, a.recv.Sub(down))
			}
		}
		d.ok = d.ok && reached
	}
	if !d.ok {
		d.all = 0
	}
	return d
}

// stale reports whether an answer named a server that was not the primary
// of record at any moment between its query and its answer.
func (s *switchoverRun) stale(a switchoverAnswer) bool {
	if a.nodes&switchoverStranger != 0 {
		return true
	}
	for i := range s.rig.nodes {
		if a.names(i) && !s.record.during(i, a.sent, a.recv) {
			return true
		}
	}
	return false
}

// analyseSplit computes a split-brain round's figures: the writes from
// the promotion to the end of the watch, and the wrong ones from the
// promotion until the next round's (until zero: the run's end).
func (s *switchoverRun) analyseSplit(res *switchoverRound, until time.Time) {
	if res.fault.IsZero() || res.promoted.IsZero() {
		return
	}
	wrong := s.wrongWrites(res.fault, until)
	for i, w := range s.writers {
		wr := switchoverWriterRound{wrong: wrong[i]}
		for _, a := range w.since(res.fault) {
			if !a.start.Before(res.restored) {
				break
			}
			switch {
			case !a.ok():
				wr.failed++
			case a.end.After(res.promoted):
				if a.node == res.from {
					wr.byOld++
				} else {
					wr.byNew++
				}
				wr.last = a.end.Sub(res.promoted)
			}
		}
		res.writers = append(res.writers, wr)
	}
	res.dns = s.dnsRound(res, func(a switchoverAnswer) bool { return a.nodata })
}

// wrongWrites counts, per writer, the writes acknowledged by a server that
// was not the primary of record at any moment of their attempt, among the
// attempts begun from from until until (zero: no bound).
func (s *switchoverRun) wrongWrites(from, until time.Time) []int {
	var out []int
	for _, w := range s.writers {
		n := 0
		for _, a := range w.since(from) {
			if !until.IsZero() && !a.start.Before(until) {
				break
			}
			if a.ok() && !s.record.during(a.node, a.start, a.end) {
				n++
			}
		}
		out = append(out, n)
	}
	return out
}

// switchoverRoundFormat lays out a round's line: the round, its switch,
// the role sessions the fleet held, the promotion's time, then per writer (one line each) its outage, beyond
// promotion and failed attempts, then (on the first line) the pollers'
// figures and how the rig was restored.
const (
	switchoverRoundFormat = "%-13s %-9s %4d %7s  %-10s %7s %9s %6d %4s | %13s %6d %11d %9s %14s | %s"
	switchoverRoundHeader = "round         switch    sess promote  writer      outage    beyond failed lost | promotion→all NODATA not-primary last-stop failed/answers | restore"
)

// line is the round's lines under switchoverRoundHeader (one per writer),
// or its cause.
func (r switchoverRound) line() string {
	head := fmt.Sprintf("%-11s %2d", r.kind, r.n)
	if r.from < 0 {
		return head + "  " + r.cause
	}
	sw := fmt.Sprintf("pg%d→pg%d", r.from+1, r.to+1)
	promote := "-"
	if !r.promoted.IsZero() {
		promote = switchoverMs(r.promoted.Sub(r.ordered))
	}
	var b strings.Builder
	for i, w := range r.writers {
		if i == 0 {
			fmt.Fprintf(&b, switchoverRoundFormat+"\n", head, sw, r.sessions, promote, switchoverWriterNames[i],
				switchoverMsOr(w.outage, w.ok), switchoverMsOr(w.beyond, w.ok), w.failed, r.lostOf(i),
				switchoverMsOr(r.dns.all, r.dns.ok), r.dns.nodata, r.dns.stale, switchoverMsOr(r.dns.staleFor, r.dns.stale > 0),
				fmt.Sprintf("%d/%d", r.dns.failed, r.dns.answers), r.restore)
			continue
		}
		fmt.Fprintf(&b, "%-13s %-9s %4s %7s  %-10s %7s %9s %6d %4s\n", "", "", "", "", switchoverWriterNames[i],
			switchoverMsOr(w.outage, w.ok), switchoverMsOr(w.beyond, w.ok), w.failed, r.lostOf(i))
	}
	if len(r.writers) == 0 {
		fmt.Fprintf(&b, "%-13s %-9s %4d %7s\n", head, sw, r.sessions, promote)
	}
	if r.cause != "" {
		fmt.Fprintf(&b, "%-13s FAILED: %s\n", "", r.cause)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// lostOf is writer i's lost writes, "-" when they were not counted.
func (r switchoverRound) lostOf(i int) string {
	if i < len(r.lost) {
		return fmt.Sprint(r.lost[i])
	}
	return "-"
}

// switchoverWriterNames are the writers' names in the order
// newSwitchoverWriters makes them.
var switchoverWriterNames = []string{"pgcluster", "multi-host"}

// report prints the summary table and reports the headline metrics.
func (s *switchoverRun) report(b *testing.B, rounds []switchoverRound, splits []switchoverRound, wrong []int) {
	var out strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&out, format, args...) }
	kinds := []switchoverKind{switchoverPlanned, switchoverUnplanned}
	byKind := map[switchoverKind][]switchoverRound{}
	for _, r := range rounds {
		if r.cause == "" {
			byKind[r.kind] = append(byKind[r.kind], r)
		}
	}
	w("\nswitchover summary (p50 / p90 / max over the completed rounds; ms)\n")
	w("%-40s", "")
	for _, k := range kinds {
		w(" %-44s", fmt.Sprintf("%s: %d of %d rounds completed", k, len(byKind[k]), switchoverCount(rounds, k)))
	}
	w("\n%-40s", "")
	for range kinds {
		for _, name := range switchoverWriterNames {
			w(" %-21s", name)
		}
		w("  ")
	}
	w("\n")
	type figure struct {
		name string
		get  func(switchoverWriterRound) (time.Duration, bool)
	}
	for _, f := range []figure{
		{"writes: outage", func(wr switchoverWriterRound) (time.Duration, bool) { return wr.outage, wr.ok }},
		{"writes: beyond promotion", func(wr switchoverWriterRound) (time.Duration, bool) { return wr.beyond, wr.ok }},
		{"writes: failed attempts (count)", func(wr switchoverWriterRound) (time.Duration, bool) {
			return time.Duration(wr.failed) * time.Millisecond, true
		}},
	} {
		w("%-40s", f.name)
		for _, k := range kinds {
			for i := range switchoverWriterNames {
				var ds []time.Duration
				for _, r := range byKind[k] {
					if i < len(r.writers) {
						if d, ok := f.get(r.writers[i]); ok {
							ds = append(ds, d)
						}
					}
				}
				w(" %-21s", switchoverTriple(ds))
			}
			w("  ")
		}
		w("\n")
	}
	dnsRow := func(name string, get func(switchoverDNSRound) (time.Duration, bool)) {
		w("%-40s", name)
		for _, k := range kinds {
			var ds []time.Duration
			for _, r := range byKind[k] {
				if d, ok := get(r.dns); ok {
					ds = append(ds, d)
				}
			}
			w(" %-44s", switchoverTriple(ds))
		}
		w("\n")
	}
	dnsRow("DNS: promotion → every instance names it", func(d switchoverDNSRound) (time.Duration, bool) { return d.all, d.ok })
	dnsRow("DNS: stop → last answer naming it", func(d switchoverDNSRound) (time.Duration, bool) { return d.staleFor, d.stale > 0 })
	sumRow := func(name string, get func(switchoverDNSRound) int) {
		w("%-40s", name)
		for _, k := range kinds {
			n, total := 0, 0
			for _, r := range byKind[k] {
				n += get(r.dns)
				total += r.dns.answers
			}
			w(" %-44s", fmt.Sprintf("%d of %d answers", n, total))
		}
		w("\n")
	}
	sumRow("DNS: NODATA answers (planned goal: 0)", func(d switchoverDNSRound) int { return d.nodata })
	sumRow("DNS: answers naming a non-primary", func(d switchoverDNSRound) int { return d.stale })
	sumRow("DNS: failed queries", func(d switchoverDNSRound) int { return d.failed })
	w("%-40s", "acknowledged writes lost (total)")
	for _, k := range kinds {
		for i := range switchoverWriterNames {
			n := 0
			for _, r := range byKind[k] {
				n += switchoverAt(r.lost, i)
			}
			w(" %-21d", n)
		}
		w("  ")
	}
	w("\n")
	w("%-40s", "wrong writes in these rounds (goal: 0)")
	for i, name := range switchoverWriterNames {
		if i < len(wrong) {
			w(" %s %d", name, wrong[i])
		}
	}
	w("   (acknowledged by a server that was not the primary of record)\n")

	for _, split := range splits {
		w("\n%s: a standby promoted while the primary keeps running", split.kind)
		if split.kind == switchoverSplitSync {
			w(", the primary waiting for both standbys (synchronous_standby_names 'ANY 2')")
		}
		w("\n")
		if split.from < 0 || split.promoted.IsZero() {
			w("  not measured: %s\n", split.cause)
			continue
		}
		w("  %s→%s (the fleet held %d role sessions) writable %s ms after the order, promote -w returned after %s ms; every instance stopped naming a primary %s ms after it returned (ok: %v)\n",
			s.rig.nodes[split.from].name, s.rig.nodes[split.to].name, split.sessions, switchoverMs(split.writable.Sub(split.ordered)),
			switchoverMs(split.promoted.Sub(split.ordered)), switchoverMs(split.dns.all), split.dns.ok)
		for i, wr := range split.writers {
			w("  %-11s after the promotion returned: %5d acknowledged by the old primary, %5d by the new, the last %s ms after it; %d failed;"+
				" %d acknowledged by the old primary once the new one took writes (wrong writes); lost %s\n",
				switchoverWriterNames[i], wr.byOld, wr.byNew, switchoverMs(wr.last), wr.failed, wr.wrong, split.lostOf(i))
		}
		if split.restore != "" {
			w("  restored: %s\n", split.restore)
		}
		if split.cause != "" {
			w("  FAILED: %s\n", split.cause)
		}
	}
	fmt.Print(out.String())

	for _, k := range kinds {
		for i, name := range switchoverWriterNames {
			var ds []time.Duration
			for _, r := range byKind[k] {
				if i < len(r.writers) && r.writers[i].ok {
					ds = append(ds, r.writers[i].beyond)
				}
			}
			if len(ds) > 0 {
				b.ReportMetric(switchoverMsf(switchoverPercentile(ds, 90)), fmt.Sprintf("%s-%s-beyond-p90-ms", strings.ReplaceAll(name, "-", ""), k))
			}
		}
		var ds []time.Duration
		nodata := 0
		for _, r := range byKind[k] {
			if r.dns.ok {
				ds = append(ds, r.dns.all)
			}
			nodata += r.dns.nodata
		}
		if len(ds) > 0 {
			b.ReportMetric(switchoverMsf(switchoverPercentile(ds, 90)), fmt.Sprintf("dns-%s-all-p90-ms", k))
		}
		b.ReportMetric(float64(nodata), fmt.Sprintf("dns-%s-nodata", k))
	}
	for i, name := range switchoverWriterNames {
		metric := strings.ReplaceAll(name, "-", "")
		b.ReportMetric(float64(switchoverAt(wrong, i)), metric+"-wrong-writes")
		for _, split := range splits {
			if i < len(split.writers) {
				prefix := metric + "-split"
				if split.kind == switchoverSplitSync {
					prefix += "sync"
				}
				b.ReportMetric(float64(split.writers[i].byOld+split.writers[i].byNew), prefix+"-writes")
				b.ReportMetric(float64(split.writers[i].wrong), prefix+"-wrong-writes")
			}
		}
	}
}

func switchoverCount(rounds []switchoverRound, k switchoverKind) int {
	n := 0
	for _, r := range rounds {
		if r.kind == k {
			n++
		}
	}
	return n
}

func switchoverAt(xs []int, i int) int {
	if i < len(xs) {
		return xs[i]
	}
	return 0
}

// triple is "p50 / p90 / max" in milliseconds, "-" for no value.
func switchoverTriple(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	return fmt.Sprintf("%s / %s / %s", switchoverMs(switchoverPercentile(ds, 50)), switchoverMs(switchoverPercentile(ds, 90)), switchoverMs(slices.Max(ds)))
}

// switchoverPercentile is the nearest-rank percentile p of ds.
func switchoverPercentile(ds []time.Duration, p int) time.Duration {
	s := slices.Sorted(slices.Values(ds))
	i := (len(s)*p + 99) / 100
	return s[max(i-1, 0)]
}

func switchoverMs(d time.Duration) string { return fmt.Sprintf("%.0f", switchoverMsf(d)) }

func switchoverMsf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// msOr is switchoverMs(d), or "never" when the value was not reached.
func switchoverMsOr(d time.Duration, ok bool) string {
	if !ok {
		return "never"
	}
	return switchoverMs(d)
}
