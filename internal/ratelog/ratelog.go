// Package ratelog bounds the log lines that input from outside can cause:
// one line per kind per period, with a count of the lines held back, so
// that whoever can write garbage where the fleet reads cannot flood its
// logs (or its disk) with it.
package ratelog

import (
	"fmt"
	"sync"
	"time"
)

// DefaultPeriod is how often a kind of line is written at most.
const DefaultPeriod = time.Minute

// Limiter writes at most one line per kind per period through logf. A
// kind is whatever the caller names; lines of one kind held back are
// counted, and the count is told with the next line of that kind written.
// Its methods are safe for concurrent use.
type Limiter struct {
	logf   func(format string, args ...any)
	period time.Duration
	now    func() time.Time

	mu    sync.Mutex
	kinds map[string]*kind
}

type kind struct {
	last time.Time // when a line of this kind was last written
	held int       // lines held back since
}

// maxKinds bounds the kinds remembered: kinds are the caller's constants,
// but a caller that names them from input must not make this grow.
const maxKinds = 1024

// New returns a Limiter writing through logf at most once per kind per
// period (DefaultPeriod when period <= 0).
func New(logf func(format string, args ...any), period time.Duration) *Limiter {
	if period <= 0 {
		period = DefaultPeriod
	}
	return &Limiter{logf: logf, period: period, now: time.Now, kinds: map[string]*kind{}}
}

// Logf writes the line unless a line of the same kind was written less
// than a period ago, in which case it is counted. It reports whether the
// line was written.
func (l *Limiter) Logf(kindName, format string, args ...any) bool {
	if l == nil || l.logf == nil {
		return false
	}
	now := l.now()
	l.mu.Lock()
	k, ok := l.kinds[kindName]
	if !ok {
		if len(l.kinds) >= maxKinds {
			l.prune(now)
		}
		k = &kind{}
		l.kinds[kindName] = k
	}
	if !k.last.IsZero() && now.Sub(k.last) < l.period {
		k.held++
		l.mu.Unlock()
		return false
	}
	held := k.held
	k.last, k.held = now, 0
	l.mu.Unlock()
	line := fmt.Sprintf(format, args...)
	if held > 0 {
		line += fmt.Sprintf(" (and %d more like it since the last such line)", held)
	}
	l.logf("%s", line)
	return true
}

// prune forgets the kinds whose period is over and that hold nothing
// back; if all are recent, it forgets them all (their counts are lost,
// the next line of each is written). l.mu is held.
func (l *Limiter) prune(now time.Time) {
	for name, k := range l.kinds {
		if now.Sub(k.last) >= l.period && k.held == 0 {
			delete(l.kinds, name)
		}
	}
	if len(l.kinds) >= maxKinds {
		clear(l.kinds)
	}
}
