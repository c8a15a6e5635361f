package discovery

import (
	"context"
)

// Result is a name resolved and its candidates ranked.
type Result struct {
	Answer
	// Ranking holds every candidate probed, the reachable ones fastest
	// first: the first Config.MaxProbes of the answer.
	Ranking Ranking
	// NotProbed counts the candidates beyond Config.MaxProbes, left out of
	// the probe round and of Ranking.
	NotProbed int
}

// Best returns the fastest reachable candidate.
func (r Result) Best() (Probed, bool) { return r.Ranking.Best() }

// Discover resolves name and probes its candidates: the T3 step before a
// connection. The error wraps ErrUnreachable when no candidate answered;
// the Result then still tells what each one did.
func (c *Client) Discover(ctx context.Context, name string) (Result, error) {
	return c.discover(ctx, name, c.port, c.defaultPort)
}

func (c *Client) discover(ctx context.Context, name string, port, fallback uint16) (Result, error) {
	ans, err := c.resolve(ctx, name, port, fallback)
	if err != nil {
		return Result{Answer: ans}, err
	}
	res := Result{Answer: ans, Ranking: c.Rank(ctx, ans.Candidates)}
	res.NotProbed = len(ans.Candidates) - len(res.Ranking)
	if _, ok := res.Best(); !ok {
		return res, unreachable(ans.Name, res.Ranking, res.NotProbed)
	}
	return res, nil
}
