package test

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// report judges the checker's answers, prints the chaos run's report and
// fails the test past the limits: any SERVFAIL, any wrong answer, any
// other error, timeouts over chaosMaxTimeouts percent of all queries.
func (r *chaosRun) report(ran time.Duration, steps map[string]int, flaps int, perf []dnsperfReport, stalls []chaosStallAt) {
	obs := r.checker.all()
	v := judgeChaos(obs, r.local, r.book(), r.budget())
	down, swap := propagation(obs, r.local, r.book())

	var b strings.Builder
	p := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	check := "check tcp"
	if r.pgc != nil {
		check = "check postgres, role sessions at the default role_interval"
	}
	p("chaos run: %v, three instances, %s every %v (timeout %v, rise %d, fall %d)", ran.Round(time.Second), check, r.interval(), r.timeout(), chaosRise, chaosFall)
	p("budget for a change to reach every answer: fall×interval + timeout + lease = %d×%v + %v + %v = %v",
		chaosFall, r.interval(), r.timeout(), 3*r.interval()+r.timeout(), r.budget())
	var done []string
	for _, name := range slices.Sorted(maps.Keys(steps)) {
		done = append(done, fmt.Sprintf("%s ×%d", name, steps[name]))
	}
	p("faults: %s; backend flaps ×%d", strings.Join(done, ", "), flaps)
	if r.attacker != nil {
		p("Redis attacker: %s", r.attacker.summary())
	}

	dnsTotal, dnsLost, dnsServfail, dnsOther := 0, 0, 0, 0
	for i, d := range perf {
		p("dnsperf on instance %d: %v", i, d)
		dnsTotal += d.completed + d.lost
		dnsLost += d.lost
		dnsServfail += d.servfail
		dnsOther += d.other
	}
	p("checker: %d queries, %d SERVFAIL, %d other rcodes, %d timeouts, %d errors; slowest answer %v",
		v.total, v.servfail, v.otherRcode, v.timeouts, v.errs, v.slowest.Round(time.Microsecond))
	p("checker latency: median %v, 99th percentile %v, 99.9th %v; the slowest:",
		latencyQuantile(obs, 0.5).Round(time.Microsecond), latencyQuantile(obs, 0.99).Round(time.Microsecond), latencyQuantile(obs, 0.999).Round(time.Microsecond))
	for _, o := range slowestQueries(obs, 5) {
		p("  %s incarnation %d %s: %v", o.send.Format("15:04:05.000"), o.inst, o.name, o.recv.Sub(o.send).Round(time.Microsecond))
	}
	p("wrong answers: %d (a backend down longer than the budget answered: %d; a backend up longer left out: %d; primary./standby. not the node in that role: %d)",
		v.wrong(), v.staleBackend, v.missingBackend, v.wrongRole)
	total := dnsTotal + v.total
	timeouts := dnsLost + v.timeouts
	share := 100 * float64(timeouts) / float64(max(total, 1))
	p("queries: %d (dnsperf %d, checker %d); SERVFAIL %d; timeouts %d = %.4f%% (limit %.2f%%)",
		total, dnsTotal, v.total, dnsServfail+v.servfail, timeouts, share, chaosMaxTimeouts)
	var stalled time.Duration
	for _, s := range stalls {
		stalled = max(stalled, s.late)
	}
	p("host stalls (a %v timer of the test process late by over %v: the host too loaded to run it): %d, the longest %v; the longest:",
		chaosStallTick, chaosStall, len(stalls), stalled.Round(time.Millisecond))
	longest := slices.SortedFunc(slices.Values(stalls), func(a, b chaosStallAt) int { return cmp.Compare(b.late, a.late) })
	for _, s := range longest[:min(len(longest), chaosExamples)] {
		p("  %s late by %v", s.at.Format("15:04:05.000"), s.late.Round(time.Millisecond))
	}
	p("backend down → gone from an instance's answers (last answer holding it): median %v, max %v over %d",
		quantile(down, 0.5), quantile(down, 1), len(down))
	if r.pgc != nil {
		p("old primary stopped → gone from primary.: median %v, max %v over %d",
			quantile(swap, 0.5), quantile(swap, 1), len(swap))
		for _, l := range r.pgc.summary() {
			p("%s", l)
		}
		p("primary. without an address during a planned switchover: %d (not counted as wrong)", v.switchNoData)
	} else {
		p("role swap COMMIT → old primary gone from primary.: median %v, max %v over %d",
			quantile(swap, 0.5), quantile(swap, 1), len(swap))
	}
	for _, w := range r.windows {
		p("%-20s noticed by the first instance after %v, by every instance after %v; slowest checker answer meanwhile %v (from %s, for %v)",
			w.what, w.noticed.first.Round(time.Millisecond), w.noticed.all.Round(time.Millisecond), slowestIn(obs, w.from, w.to).Round(time.Microsecond),
			w.from.Format("15:04:05.000"), w.to.Sub(w.from).Round(time.Millisecond))
		if f := w.failover; f != nil {
			p("  %s: standby promoted %v after the stop (once every instance noticed it); registry_up 1 again on the first instance %v after the promotion, on every instance after %v; a role swap committed on the new primary answered by every instance %v after its COMMIT",
				w.what, f.promoted.Round(time.Millisecond), f.up.first.Round(time.Millisecond), f.up.all.Round(time.Millisecond), f.answered.Round(time.Millisecond))
		}
	}
	if up, answered := failovers(r.windows); len(up) > 0 {
		p("registry fail-over: promotion → registry_up 1 on every instance: median %v, max %v; COMMIT on the new primary → answered by every instance: median %v, max %v; over %d",
			quantile(up, 0.5), quantile(up, 1), quantile(answered, 0.5), quantile(answered, 1), len(up))
	}
	p("timeline:")
	for _, e := range r.timeline {
		p("  %s", e)
	}
	for _, kind := range slices.Sorted(maps.Keys(v.examples)) {
		p("first %s answers:", kind)
		for _, e := range v.examples[kind] {
			p("  %s", e)
		}
	}
	r.t.Logf("chaos report\n%s", b.String())

	if n := dnsServfail + v.servfail; n > 0 {
		r.t.Errorf("%d SERVFAIL answers (dnsperf %d, checker %d)", n, dnsServfail, v.servfail)
	}
	if dnsOther+v.otherRcode+v.errs > 0 {
		r.t.Errorf("unexpected answers: dnsperf %d other rcodes, checker %d other rcodes and %d errors", dnsOther, v.otherRcode, v.errs)
	}
	if v.wrong() > 0 {
		r.t.Errorf("%d wrong answers", v.wrong())
	}
	if share >= chaosMaxTimeouts {
		r.t.Errorf("%d of %d queries timed out (%.4f%%, limit %.2f%%)", timeouts, total, share, chaosMaxTimeouts)
	}
	if dnsTotal == 0 || v.total == 0 {
		r.t.Errorf("no load: dnsperf answered %d queries, the checker %d", dnsTotal, v.total)
	}
}

// quantile returns the q quantile of sorted ds, rounded to the millisecond.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[int(q*float64(len(ds)-1))].Round(time.Millisecond)
}

// failovers returns, sorted, how long each registry fail-over of windows
// took from the promotion until every instance's registry_up was 1, and
// from a change committed on the new primary until every instance
// answered it.
func failovers(windows []chaosWindow) (up, answered []time.Duration) {
	for _, w := range windows {
		if f := w.failover; f != nil {
			up = append(up, f.up.all)
			answered = append(answered, f.answered)
		}
	}
	slices.Sort(up)
	slices.Sort(answered)
	return up, answered
}
