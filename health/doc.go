// Package health runs active health checks against a changing set of
// backends and reports verdict changes, not raw probe results.
//
// A Checker keeps one timer per target. Every Interval (the first time after
// a random offset in [0, Interval), so that targets spread out) the timer
// starts a goroutine that runs one probe, bounded by Timeout, judges it and
// arms the timer again: one probe in flight per target, and between probes a
// target holds no goroutine, so 10,000 targets cost little memory. With a
// ProbeBudget, probes start at most at its rate: one that finds it spent
// waits its turn in a queue, still without a goroutine. A target
// becomes Up after Rise consecutive successes and Down after Fall consecutive
// failures; until then it is Unknown and absent from the View.
//
// Two checks exist. "tcp" succeeds when a TCP connection is accepted within
// Timeout. "postgres" connects with pgconn, reads pg_is_in_recovery() and the
// WAL position, and names the reason of a failure with a stable word (Cause)
// taken from the server's SQLSTATE or the network error, never from message
// text.
//
// The owner feeds targets with SetTargets at any time (targets that did not
// change keep their state and timer) and receives whole, immutable Views
// through the publish function given to Run, one call at a time. A removed
// target's probe in flight is cut short and its socket closed at once; when
// Run returns, every goroutine it started has ended and every socket is closed.
//
// The package knows nothing of DNS: its owner decides what a verdict means.
package health
