package lock

import (
	"context"
	"errors"

	"github.com/redis/go-redis/v9"
)

// scriptCall is one run of a script in evalEach: its keys and arguments.
type scriptCall struct {
	keys []string
	args []any
}

// evalEach runs script once per call in one round trip, each by its SHA1
// (EVALSHA), and returns the replies in the calls' order and the first
// error among them, as a pipeline does. Sent with EVAL, the script's body
// would travel with each of thousands of calls (a lease take for every
// key of a joining member, a read of every status), and Redis would hash
// it for each. The calls Redis answers NOSCRIPT (its script cache emptied
// by a restart or SCRIPT FLUSH) are sent again in a second round trip with
// the body, which also puts the script back in the cache.
func evalEach(ctx context.Context, c redis.Cmdable, script *redis.Script, calls []scriptCall) ([]*redis.Cmd, error) {
	cmds := make([]*redis.Cmd, len(calls))
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, call := range calls {
			cmds[i] = script.EvalSha(ctx, p, call.keys, call.args...)
		}
		return nil
	})
	var again []int
	for i, cmd := range cmds {
		if noScript(cmd.Err()) {
			again = append(again, i)
		}
	}
	if len(again) == 0 {
		return cmds, err
	}
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, i := range again {
			cmds[i] = script.Eval(ctx, p, calls[i].keys, calls[i].args...)
		}
		return nil
	})
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil {
			return cmds, err
		}
	}
	return cmds, nil
}

// noScript reports whether err is Redis's answer to EVALSHA for a script
// it does not hold.
func noScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
