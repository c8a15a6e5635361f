package discovery

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Probed is one candidate's outcome in a probe round.
type Probed struct {
	Candidate
	// Latency is how long the candidate took to answer, when it did.
	Latency time.Duration
	// Err tells why the candidate is unreachable; nil when it answered.
	Err error
}

// Reachable reports whether the candidate answered.
func (p Probed) Reachable() bool { return p.Err == nil }

// String returns "ip:port latency" or "ip:port unreachable (why)".
func (p Probed) String() string {
	if p.Reachable() {
		return p.Addr.String() + " " + p.Latency.Round(time.Microsecond).String()
	}
	return fmt.Sprintf("%s unreachable (%v)", p.Addr, p.Err)
}

// Ranking is the outcome of a probe round: the reachable candidates, by SRV
// priority (RFC 2782: the lowest reachable first; with pgcluster's
// topology, the nearest) and fastest first within one, then the
// unreachable ones in answer order.
type Ranking []Probed

// Best returns the first reachable candidate: of the lowest SRV priority,
// the fastest.
func (r Ranking) Best() (Probed, bool) {
	if len(r) == 0 || !r[0].Reachable() {
		return Probed{}, false
	}
	return r[0], true
}

// Reachable returns the reachable candidates, in ranking order.
func (r Ranking) Reachable() Ranking {
	i := slices.IndexFunc(r, func(p Probed) bool { return !p.Reachable() })
	if i < 0 {
		return r
	}
	return r[:i]
}

// Rank probes every candidate in parallel, each within the same timeout, so a
// candidate that never answers costs one timeout however many there are.
// It opens one connection per candidate at once: bound cands (as
// Client.Rank does with Config.MaxProbes).
func Rank(ctx context.Context, p Prober, timeout time.Duration, cands []Candidate) Ranking {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, fmt.Errorf("probe timeout %s", timeout))
	defer cancel()
	r := make(Ranking, len(cands))
	var wg sync.WaitGroup
	for i, c := range cands {
		wg.Go(func() {
			d, err := p.Probe(ctx, c.Addr)
			r[i] = Probed{Candidate: c, Latency: d, Err: err}
		})
	}
	wg.Wait()
	slices.SortStableFunc(r, func(a, b Probed) int {
		switch {
		case a.Reachable() != b.Reachable():
			if a.Reachable() {
				return -1
			}
			return 1
		case !a.Reachable():
			return 0
		case a.Priority != b.Priority:
			return cmp.Compare(a.Priority, b.Priority)
		}
		return cmp.Compare(a.Latency, b.Latency)
	})
	return r
}

// Rank probes cands with the Client's prober and timeout: the first
// Config.MaxProbes of them, the others are left out of the Ranking.
func (c *Client) Rank(ctx context.Context, cands []Candidate) Ranking {
	return Rank(ctx, c.prober, c.probeTimeout, cands[:min(len(cands), c.maxProbes)])
}

// ErrUnreachable is returned when no candidate answered the probe.
var ErrUnreachable = errors.New("no candidate reachable")

// unreachable describes a probe round in which nobody answered, in a
// bounded number of bytes however many candidates there were; notProbed
// counts the candidates beyond Config.MaxProbes.
func unreachable(name string, r Ranking, notProbed int) error {
	parts := make([]string, 0, len(r))
	for _, p := range r {
		parts = append(parts, fmt.Sprintf("%s: %v", p.Addr, p.Err))
	}
	if notProbed == 0 {
		return fmt.Errorf("discovery: %s: %w (%s)", name, ErrUnreachable, failures("candidates", parts))
	}
	why := failures("probed candidates", parts)
	why += fmt.Sprintf("; %d other candidates not probed (at most %d per round)", notProbed, len(r))
	return fmt.Errorf("discovery: %s: %w (%s)", name, ErrUnreachable, why)
}
