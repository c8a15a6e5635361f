package lock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// scanCount is the COUNT hint of each SCAN step of a resync.
const scanCount = 256

// Subscriber applies the statuses published under a prefix, each key's in
// version order, and resynchronises every stored status on each
// (re)subscription and every Resync interval, so that a message lost while
// disconnected costs at most one interval.
type Subscriber struct {
	rdb    redis.UniversalClient
	prefix string
	resync time.Duration
	// OnError, when set, is told of each failed resync and unreadable
	// message; the subscriber carries on regardless.
	OnError func(error)

	last map[string]int64 // highest version applied per key; Subscribe's goroutine only
}

// NewSubscriber returns a subscriber to the statuses under prefix on rdb,
// resynchronising every resync interval in addition to each subscription.
func NewSubscriber(rdb redis.UniversalClient, prefix string, resync time.Duration) (*Subscriber, error) {
	if err := checkClient(rdb); err != nil {
		return nil, err
	}
	if resync <= 0 {
		return nil, fmt.Errorf("lock: resync interval %v is not positive; give how often every status is re-read", resync)
	}
	return &Subscriber{rdb: rdb, prefix: prefix, resync: resync, last: map[string]int64{}}, nil
}

// Subscribe applies statuses until ctx is done, then returns ctx's error.
// apply is called from this goroutine only, once per newer version of a
// key: a message or stored status whose version is not above the last one
// applied for its key is dropped. Subscribe keeps going while Redis is
// unreachable and resynchronises once it is back. A Subscriber runs one
// Subscribe at a time.
func (s *Subscriber) Subscribe(ctx context.Context, apply func(key string, version int64, status []byte)) error {
	ps := s.rdb.Subscribe(ctx, channel(s.prefix))
	defer ps.Close()
	msgs := ps.ChannelWithSubscriptions(
		redis.WithChannelHealthCheckInterval(time.Second),
		redis.WithChannelPingTimeout(CallTimeout),
		redis.WithChannelReconnectTimeout(CallTimeout),
	)
	tick := time.NewTicker(s.resync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			s.resyncAll(ctx, apply)
		case m, ok := <-msgs:
			if !ok {
				return fmt.Errorf("lock: subscription to %q closed", channel(s.prefix))
			}
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					// First subscription or a reconnect: whatever was
					// published meanwhile is only in the stored statuses.
					s.resyncAll(ctx, apply)
				}
			case *redis.Message:
				key, v, status, err := parseMessage(m.Payload)
				if err != nil {
					s.fail(err)
					continue
				}
				s.offer(key, v, status, apply)
			}
		}
	}
}

// offer applies a status if its version is newer than the key's last one.
func (s *Subscriber) offer(key string, v int64, status []byte, apply func(string, int64, []byte)) {
	if v <= s.last[key] {
		return
	}
	s.last[key] = v
	apply(key, v, status)
}

func (s *Subscriber) fail(err error) {
	if s.OnError != nil {
		s.OnError(err)
	}
}

// resyncAll reads every stored status and offers it. On Redis Cluster it
// scans every master.
func (s *Subscriber) resyncAll(ctx context.Context, apply func(string, int64, []byte)) {
	type stored struct {
		key    string
		v      int64
		status []byte
	}
	var (
		mu  sync.Mutex // ForEachMaster reads the masters concurrently
		all []stored
	)
	read := func(ctx context.Context, c redis.UniversalClient) error {
		var cursor uint64
		for {
			cctx, cancel := context.WithTimeout(ctx, CallTimeout)
			names, next, err := c.Scan(cctx, cursor, statusPattern(s.prefix), scanCount).Result()
			if err != nil {
				cancel()
				return err
			}
			if len(names) > 0 {
				cmds := make([]*redis.SliceCmd, len(names))
				_, err = c.Pipelined(cctx, func(p redis.Pipeliner) error {
					for i, n := range names {
						cmds[i] = p.HMGet(cctx, n, "v", "s")
					}
					return nil
				})
				if err != nil && !errors.Is(err, redis.Nil) {
					cancel()
					return err
				}
				for i, n := range names {
					key, ok := keyOfStatus(s.prefix, n)
					if !ok {
						continue
					}
					vals, err := cmds[i].Result()
					if err != nil || len(vals) != 2 {
						continue
					}
					vs, ok1 := vals[0].(string)
					st, ok2 := vals[1].(string)
					if !ok1 || !ok2 {
						continue // deleted meanwhile, or written by someone else
					}
					v, err := strconv.ParseInt(vs, 10, 64)
					if err != nil {
						continue
					}
					mu.Lock()
					all = append(all, stored{key, v, []byte(st)})
					mu.Unlock()
				}
			}
			cancel()
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var err error
	if cc, ok := s.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return read(ctx, c) })
	} else {
		err = read(ctx, s.rdb)
	}
	if err != nil {
		// What was read is still applied: versions keep it safe.
		s.fail(fmt.Errorf("lock: resync of the statuses under %q: %w", s.prefix, err))
	}
	for _, st := range all {
		s.offer(st.key, st.v, st.status, apply)
	}
}
