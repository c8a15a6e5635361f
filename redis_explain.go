package pgcluster

import "github.com/pgcluster/pgcluster/internal/rediserr"

// redisLogf is the Logf given to lock/: its "Redis: " lines at info, each
// error among their arguments described by what it means and what to do
// (refused, timed out, authentication or TLS failed; see rediserr), dials
// being the client's failed connections, which explain a call that only
// timed out.
func redisLogf(dials *rediserr.Dials) func(format string, args ...any) {
	return func(format string, args ...any) {
		shown := make([]any, len(args))
		for i, a := range args {
			if err, ok := a.(error); ok {
				a = dials.Explain(err)
			}
			shown[i] = a
		}
		log.Infof("Redis: "+format, shown...)
	}
}
