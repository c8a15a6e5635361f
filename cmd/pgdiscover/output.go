package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/pgcluster/pgcluster/discovery"
)

// printer writes results and events as text or JSON lines. Each line is
// one write, so it is out as soon as it happens.
type printer struct {
	w       io.Writer
	json    bool
	verbose bool
	mu      sync.Mutex
}

type jsonResult struct {
	Name       string          `json:"name"`
	Canonical  string          `json:"canonical,omitempty"`
	TTL        float64         `json:"ttl_seconds"`
	SRV        bool            `json:"srv"`
	Truncated  bool            `json:"truncated,omitempty"`
	Unresolved int             `json:"unresolved,omitempty"`
	NotProbed  int             `json:"not_probed,omitempty"`
	Chosen     string          `json:"chosen,omitempty"`
	Candidates []jsonCandidate `json:"candidates"`
	Error      string          `json:"error,omitempty"`
}

type jsonCandidate struct {
	Addr      string   `json:"addr"`
	Host      string   `json:"host"`
	LatencyMS *float64 `json:"latency_ms,omitempty"`
	Error     string   `json:"error,omitempty"`
}

type jsonEvent struct {
	Event  string `json:"event"`
	Addr   string `json:"addr"`
	Host   string `json:"host"`
	Reason string `json:"reason"`
}

// result prints the chosen candidate first, then with -v every candidate.
func (p *printer) result(res discovery.Result, err error) {
	best, ok := res.Best()
	if p.json {
		jr := jsonResult{Name: res.Name, Canonical: res.Canonical, TTL: res.TTL.Seconds(), SRV: res.SRV,
			Truncated: res.Truncated, Unresolved: res.Unresolved, NotProbed: res.NotProbed,
			Candidates: []jsonCandidate{}}
		if ok {
			jr.Chosen = best.Addr.String()
		}
		if err != nil {
			jr.Error = err.Error()
		}
		for _, c := range res.Ranking {
			jc := jsonCandidate{Addr: c.Addr.String(), Host: c.Host}
			if c.Reachable() {
				ms := float64(c.Latency) / float64(time.Millisecond)
				jc.LatencyMS = &ms
			} else {
				jc.Error = c.Err.Error()
			}
			jr.Candidates = append(jr.Candidates, jc)
		}
		p.writeJSON(jr)
		return
	}
	if !ok {
		return
	}
	var b strings.Builder
	fmt.Fprintln(&b, best.Addr)
	if p.verbose {
		for _, c := range res.Ranking {
			if c.Reachable() {
				fmt.Fprintf(&b, "%s\t%s\t%s\n", c.Addr, c.Latency.Round(time.Microsecond), c.Host)
			} else {
				fmt.Fprintf(&b, "%s\tunreachable (%v)\t%s\n", c.Addr, c.Err, c.Host)
			}
		}
	}
	p.write(b.String())
}

// event prints "+ ip:port" or "- ip:port".
func (p *printer) event(e discovery.Event) {
	if p.json {
		p.writeJSON(jsonEvent{Event: e.Kind.String(), Addr: e.Candidate.Addr.String(), Host: e.Candidate.Host, Reason: e.Reason.String()})
		return
	}
	p.write(e.String() + "\n")
}

func (p *printer) writeJSON(v any) {
	b, _ := json.Marshal(v)
	p.write(string(b) + "\n")
}

func (p *printer) write(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	io.WriteString(p.w, s)
}
