package discovery

import (
	"fmt"
	"strings"
	"time"

	"github.com/miekg/dns"
)

const (
	// DefaultWatchInterval is how often a Watcher resolves again when the
	// TTL is longer or unknown.
	DefaultWatchInterval = 30 * time.Second
	// DefaultMinInterval is the shortest time between two resolutions.
	DefaultMinInterval = 500 * time.Millisecond
	// MinWatchInterval is the floor of WatchOptions.Interval and
	// MinInterval: a Watcher resolves at most ten times a second (each
	// resolution sends a few DNS queries), whatever it is told.
	MinWatchInterval = 100 * time.Millisecond

	// DefaultStateInterval is how often a Pool of primary.CLUSTER asks
	// for the primary's state between resolutions.
	DefaultStateInterval = MinWatchInterval

	// maxRetryInterval caps the backoff after failed resolutions.
	maxRetryInterval = 5 * time.Second
)

// roleLabels are the first labels of names that already select nodes by
// role; their primary is not watched.
var roleLabels = []string{"primary", "standby", "replica", "prefer-standby"}

// WatchOptions configures a Watcher. The zero value is ready to use.
type WatchOptions struct {
	// Interval is the longest time between two resolutions, whatever the
	// TTL; DefaultWatchInterval when zero. Watch refuses a value below
	// MinWatchInterval.
	Interval time.Duration
	// MinInterval is the shortest time between two resolutions, whatever
	// the TTL or the number of errors reported; DefaultMinInterval when
	// zero, Interval when that is shorter. Watch refuses a value below
	// MinWatchInterval.
	MinInterval time.Duration
	// Primary is the name whose answer is watched for a primary switch;
	// when it changes the watched name is resolved again at once. When
	// empty it is "primary." + the watched name, unless that name's first
	// label already is a role (primary, standby, replica, prefer-standby).
	Primary string
	// IgnorePrimary turns the primary watch off.
	IgnorePrimary bool
	// OnEvent is called for every candidate that joins or leaves, in order,
	// from the Watcher's goroutine; the first resolution reports each
	// candidate as Added with ReasonInitial. It must return quickly and must
	// not call Refresh or Close.
	OnEvent func(Event)
	// OnError is called, from the Watcher's goroutine, when a resolution
	// fails. The Watcher keeps the previous answer and tries again with a
	// backoff from MinInterval up to 5 seconds.
	OnError func(error)
	// ReadWriteFallback tells what a Pool whose host is primary.CLUSTER
	// does while pgcluster's TXT record there says that the old primary
	// has left and no new one is seen ("state=held" or "state=none"):
	// ReadWriteFallbackOn, the zero value, connects to the serving nodes
	// of CLUSTER and hands out the first connection whose node takes
	// writes; ReadWriteFallbackOff waits for DNS to name the new primary.
	// Only a Pool of a primary. name uses it; Watch and other names
	// ignore it.
	ReadWriteFallback ReadWriteFallback
	// StateInterval is how often a Pool whose host is primary.CLUSTER
	// asks for the primary's state (one TXT query, see PrimaryState)
	// when no resolution did within it, so that it stops writing to a
	// primary soon after pgcluster stops naming it — two nodes claim to
	// be primary, or another node is the primary — however long the
	// TTL; a changed state is resolved at once. DefaultStateInterval when
	// zero; Watch refuses a value below MinWatchInterval. A value above
	// the answer's TTL leaves the state to the resolutions. Watch and
	// other names ignore it.
	StateInterval time.Duration

	// pool is set by NewPoolWithConfig: a Pool follows the Watcher, reads
	// the primary's state and checks connections made through the
	// fallback read-write.
	pool bool
	// onFallback is called, from the Watcher's goroutine, after each
	// resolution that leaves the Watcher in the read-write fallback.
	onFallback func()
	// onServeLost is called, from the Watcher's goroutine, when an
	// address a Pool kept connections to no longer serves.
	onServeLost func()
}

// check tells what is wrong with the intervals: a negative one, or one
// below MinWatchInterval.
func (o WatchOptions) check() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"Interval", o.Interval}, {"MinInterval", o.MinInterval}, {"StateInterval", o.StateInterval}} {
		if f.d != 0 && f.d < MinWatchInterval {
			return fmt.Errorf("discovery: WatchOptions.%s %s is below the floor of %s (MinWatchInterval); 0 means the default", f.name, f.d, MinWatchInterval)
		}
	}
	return nil
}

// withDefaults fills in the zero fields.
func (o WatchOptions) withDefaults() WatchOptions {
	if o.Interval <= 0 {
		o.Interval = DefaultWatchInterval
	}
	if o.MinInterval <= 0 {
		o.MinInterval = DefaultMinInterval
	}
	o.MinInterval = min(o.MinInterval, o.Interval)
	if o.StateInterval <= 0 {
		o.StateInterval = DefaultStateInterval
	}
	return o
}

// primaryName returns the name watched for a primary switch of name, or ""
// for none.
func (o WatchOptions) primaryName(name string) string {
	switch {
	case o.IgnorePrimary:
		return ""
	case o.Primary != "":
		return dns.Fqdn(o.Primary)
	}
	first, _, _ := strings.Cut(name, ".")
	for _, l := range roleLabels {
		if strings.EqualFold(first, l) {
			return ""
		}
	}
	return "primary." + name
}

// next returns when to resolve again after an answer with ttl, or after
// failures failed resolutions in a row, and why.
func (o WatchOptions) next(ttl time.Duration, failures int) (time.Duration, Reason) {
	if failures > 0 {
		d := o.MinInterval << min(failures-1, 16)
		return min(d, o.Interval, maxRetryInterval), ReasonRetry
	}
	if ttl < o.Interval {
		return max(ttl, o.MinInterval), ReasonTTL
	}
	return o.Interval, ReasonTimer
}
