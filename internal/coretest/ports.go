package coretest

import (
	"errors"
	"io"
	"sync"

	"github.com/pgcluster/pgcluster/internal/proc"
)

// Ports are the loopback ports an instance listens on.
type Ports struct {
	DNS     int // UDP and TCP
	Metrics int // the prometheus plugin
	Health  int // the health plugin
	Ready   int // the ready plugin
}

// Claims are the ports given to instances. A port is free again once
// FreePorts lets go of it, before the instance binds it, and CoreDNS binds
// with SO_REUSEPORT: two instances started at once and given the same port
// would share it without an error, one's metrics answering for both. A port
// once claimed is not given again. The zero value is ready to use.
type Claims struct {
	mu    sync.Mutex
	ports map[int]bool
}

func (c *Claims) claimed(p int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ports[p]
}

func (c *Claims) claim(ps ...int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ports == nil {
		c.ports = map[int]bool{}
	}
	for _, p := range ps {
		c.ports[p] = true
	}
}

// FreePorts returns an instance's loopback ports, free a moment ago and not
// in claims, and adds them to claims: for DNS (TCP and UDP; dns itself when
// it is not 0), metrics, health and readiness. All are held until all are
// found, so that they differ.
func FreePorts(dns int, claims *Claims) (Ports, error) {
	var held []io.Closer
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	listen := func(udp bool) (int, error) {
		for range 10 {
			p, h, err := proc.HoldPort("127.0.0.1", udp)
			held = append(held, h...)
			if err != nil || !claims.claimed(p) {
				return p, err
			}
			// A claimed port is held until the end: not picked again here.
		}
		return 0, errors.New("find a free loopback port: every one found in 10 tries was claimed")
	}
	p := Ports{DNS: dns}
	for i, dst := range []*int{&p.DNS, &p.Metrics, &p.Health, &p.Ready} {
		if *dst != 0 {
			continue
		}
		port, err := listen(i == 0)
		if err != nil {
			return p, err
		}
		*dst = port
	}
	// Claimed while still held: another call can only be given one of
	// these ports once it is claimed.
	claims.claim(p.DNS, p.Metrics, p.Health, p.Ready)
	return p, nil
}
