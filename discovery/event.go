package discovery

import (
	"fmt"
)

// EventKind tells what happened to a candidate.
type EventKind int

const (
	// Added means the candidate joined the answer.
	Added EventKind = iota + 1
	// Removed means the candidate left the answer.
	Removed
)

// String returns "+" or "-".
func (k EventKind) String() string {
	switch k {
	case Added:
		return "+"
	case Removed:
		return "-"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Reason tells why a Watcher resolved the name again.
type Reason int

const (
	// ReasonInitial is the first resolution.
	ReasonInitial Reason = iota + 1
	// ReasonTTL means the previous answer's TTL ran out.
	ReasonTTL
	// ReasonTimer means WatchOptions.Interval passed.
	ReasonTimer
	// ReasonError means the caller reported a connection error.
	ReasonError
	// ReasonPrimary means the answer for the primary's name changed or,
	// for a Pool of primary.CLUSTER, the primary's state in TXT did.
	ReasonPrimary
	// ReasonRefresh means the caller asked for it.
	ReasonRefresh
	// ReasonRetry means the previous resolution failed.
	ReasonRetry
)

var reasonNames = map[Reason]string{
	ReasonInitial: "initial",
	ReasonTTL:     "ttl",
	ReasonTimer:   "timer",
	ReasonError:   "error",
	ReasonPrimary: "primary",
	ReasonRefresh: "refresh",
	ReasonRetry:   "retry",
}

// String returns the reason's lower-case name.
func (r Reason) String() string {
	if s, ok := reasonNames[r]; ok {
		return s
	}
	return fmt.Sprintf("Reason(%d)", int(r))
}

// Event is a change in what a watched name resolves to.
type Event struct {
	// Kind tells whether the candidate joined or left.
	Kind EventKind
	// Candidate is the address that changed.
	Candidate Candidate
	// Primary is set when the change is to the answer for the primary's
	// name (see WatchOptions.Primary) rather than for the watched name.
	Primary bool
	// Reason is why the Watcher resolved again.
	Reason Reason
}

// String returns "+ ip:port" or "- ip:port".
func (e Event) String() string { return e.Kind.String() + " " + e.Candidate.Addr.String() }
