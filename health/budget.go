package health

import (
	"container/heap"
	"math"
	"sync"
	"time"
)

// budget spaces the probes of one Run by Config.ProbeBudget: a token bucket
// holding one token, refilled at the rate, so that two probes start at
// least 1/rate apart and no span holds more than its length's worth of the
// rate, rounded up (at 250 a second, 25 in any 100 ms): a fleet of N
// instances never starts more than N budgets' worth in any 100 ms, however
// many probes fall due together (all of them, when Redis stops answering
// and every instance probes every target). A probe that finds no token, or
// others waiting, waits in a queue by due time, holding no goroutine, and
// the budget starts it when its turn comes (dispatch). A turn is spent only
// by a probe that starts: a target the fleet gave back meanwhile gives its
// token to the next.
type budget struct {
	wg    *sync.WaitGroup // the Run's: a dispatch pending counts in it
	start func(w *worker, waited time.Duration) bool

	mu     sync.Mutex
	rate   float64 // probes a second; 0: no budget
	tokens float64
	at     time.Time // tokens as of then
	queue  waiting
	timer  *time.Timer // runs dispatch; pending while armed
	armed  bool
	closed bool
}

// newBudget returns the budget of a Run at rate (0: none). start is called
// for each probe whose turn came after it waited: it reports whether the
// probe started.
func newBudget(rate float64, wg *sync.WaitGroup, start func(w *worker, waited time.Duration) bool) *budget {
	b := &budget{wg: wg, start: start, rate: rate, at: time.Now()}
	b.tokens = b.burst()
	b.timer = time.AfterFunc(time.Hour, b.dispatch)
	b.timer.Stop()
	return b
}

// burst is the most tokens the bucket holds.
func (b *budget) burst() float64 { return 1 }

// refill adds the tokens earned since b.at. b.mu is held.
func (b *budget) refill(now time.Time) {
	if b.rate > 0 {
		b.tokens = min(b.burst(), b.tokens+now.Sub(b.at).Seconds()*b.rate)
	}
	b.at = now
}

// admit reports whether w may probe now, taking a token; otherwise w waits
// in the queue under key (earlier goes first) until dispatch starts it.
// The caller holds w.mu and w is not stopped: stop, which holds w.mu too,
// then finds w either queued or not yet.
func (b *budget) admit(w *worker, key time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.rate == 0 && len(b.queue) == 0 {
		return true
	}
	now := time.Now()
	b.refill(now)
	if len(b.queue) == 0 && b.tokens >= 1 {
		b.tokens--
		return true
	}
	w.key, w.queuedAt = key, now
	heap.Push(&b.queue, w)
	b.arm()
	return false
}

// remove takes w out of the queue, reporting whether it was there. The
// caller holds w.mu.
func (b *budget) remove(w *worker) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w.qi < 0 {
		return false
	}
	heap.Remove(&b.queue, w.qi)
	return true
}

// arm schedules dispatch for when the next token is due, unless it is
// scheduled already. b.mu is held.
func (b *budget) arm() {
	if b.armed || b.closed || len(b.queue) == 0 {
		return
	}
	var d time.Duration
	if b.rate > 0 && b.tokens < 1 {
		// Rounded up: a wait rounded down to nothing would earn nothing,
		// and dispatch would arm itself again at once, spinning.
		d = time.Duration(math.Ceil((1 - b.tokens) / b.rate * float64(time.Second)))
	}
	b.armed = true
	b.wg.Add(1)
	b.timer.Reset(d)
}

// dispatch starts the queued probes whose turn came, in the queue's order,
// and arms itself for the next.
func (b *budget) dispatch() {
	defer b.wg.Done()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.armed = false
	for len(b.queue) > 0 && !b.closed {
		now := time.Now()
		b.refill(now)
		if b.rate > 0 && b.tokens < 1 {
			break
		}
		w := heap.Pop(&b.queue).(*worker)
		spent := b.rate > 0
		if spent {
			b.tokens--
		}
		b.mu.Unlock()
		started := b.start(w, now.Sub(w.queuedAt))
		b.mu.Lock()
		if spent && !started {
			b.tokens = min(b.burst(), b.tokens+1)
		}
	}
	b.arm()
}

// setRate changes the rate; the probes waiting start by the new one.
func (b *budget) setRate(rate float64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refill(time.Now())
	b.rate = rate
	b.tokens = min(b.tokens, b.burst())
	if b.armed && b.timer.Stop() {
		b.armed = false
		b.wg.Done()
	}
	b.arm()
}

// close stops dispatching; the Run has stopped every worker, which left
// the queue.
func (b *budget) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.armed && b.timer.Stop() {
		b.armed = false
		b.wg.Done()
	}
}

// waiting is the budget's queue: a heap of workers by key, then by the time
// they came.
type waiting []*worker

func (q waiting) Len() int { return len(q) }

func (q waiting) Less(i, j int) bool {
	if !q[i].key.Equal(q[j].key) {
		return q[i].key.Before(q[j].key)
	}
	return q[i].queuedAt.Before(q[j].queuedAt)
}

func (q waiting) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].qi, q[j].qi = i, j
}

func (q *waiting) Push(x any) {
	w := x.(*worker)
	w.qi = len(*q)
	*q = append(*q, w)
}

func (q *waiting) Pop() any {
	old := *q
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*q = old[:len(old)-1]
	w.qi = -1
	return w
}
