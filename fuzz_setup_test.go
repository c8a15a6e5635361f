package pgcluster

import (
	"context"
	"errors"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/plugin"
	"github.com/coredns/coredns/plugin/pkg/dnstest"
	"github.com/coredns/coredns/plugin/test"

	"github.com/miekg/dns"
)

// FuzzSetup parses arbitrary pgcluster stanzas as CoreDNS does at start-up
// (setup's parse, through caddy.NewTestController). Nothing may panic or
// connect. An error names the Corefile and the line (a second block aside,
// plugin.ErrOnce), and never holds a password of the DSN or of a Redis URL,
// nor the redis_secret. A stanza that parses has settings every part of
// pgcluster can rely on: a DSN, zones that do not overlap, options within
// their bounds, Redis only with checks and with a usable prefix.
// Seeds: testdata/fuzz/FuzzSetup.
func FuzzSetup(f *testing.F) {
	f.Add("pgcluster {\n postgres " + dsn + "\n}")
	f.Fuzz(func(t *testing.T, input string) {
		c := caddy.NewTestController("dns", input)
		// As CoreDNS gives them, for a block without ZONES.
		c.ServerBlockKeys = []string{"dns://pgcluster.lan.:53", "dns://b.lan.:1053"}
		p, cfg, err := parse(c)
		if err != nil {
			checkParseError(t, input, err)
			return
		}
		checkSettings(t, p, cfg)
	})
}

// checkParseError fails t when err does not say where, or holds a secret
// of input.
func checkParseError(t *testing.T, input string, err error) {
	t.Helper()
	msg := err.Error()
	if !errors.Is(err, plugin.ErrOnce) && !strings.Contains(msg, "Testfile:") {
		t.Fatalf("error without the Corefile and line: %q", msg)
	}
	for _, s := range secrets(input) {
		if strings.Contains(msg, s) {
			t.Fatalf("error %q holds the secret %q", msg, s)
		}
	}
}

// secrets returns the passwords of the DSNs and Redis URLs of input and its
// redis_secret values: those of 8 bytes or more that appear in input once
// (shorter ones, or one repeated elsewhere in the stanza, could be in an
// error for another reason).
func secrets(input string) []string {
	var found []string
	c := caddy.NewTestController("dns", input)
	for c.Next() {
		for c.NextBlock() {
			opt := c.Val()
			args := c.RemainingArgs()
			if len(args) == 0 {
				continue
			}
			switch opt {
			case "redis_secret":
				found = append(found, args[0])
			case "postgres", "redis":
				for _, kv := range strings.Fields(args[0]) {
					if pw, ok := strings.CutPrefix(kv, "password="); ok {
						found = append(found, strings.Trim(pw, "'"))
					}
				}
				u, err := url.Parse(args[0])
				if err != nil {
					continue
				}
				if pw, ok := u.User.Password(); ok {
					found = append(found, pw, url.QueryEscape(pw), url.PathEscape(pw))
				}
				q, _ := url.ParseQuery(u.RawQuery)
				for _, pw := range q["password"] {
					found = append(found, pw, url.QueryEscape(pw))
				}
			}
		}
	}
	var out []string
	for _, s := range found {
		if len(s) >= 8 && strings.Count(input, s) == 1 {
			out = append(out, s)
		}
	}
	return out
}

// checkSettings fails t unless p and cfg, a parsed stanza, are what the
// rest of pgcluster relies on.
func checkSettings(t *testing.T, p *PgCluster, cfg *settings) {
	t.Helper()
	if cfg.dsn == "" || badDSN(cfg.dsn) != "" {
		t.Fatalf("parsed without a usable DSN: %q", cfg.dsn)
	}
	if len(cfg.zones) == 0 || strings.Join(p.Zones, " ") != strings.Join(cfg.zones, " ") {
		t.Fatalf("zones %v, the handler's %v", cfg.zones, p.Zones)
	}
	for _, z := range cfg.zones {
		if !strings.HasSuffix(z, ".") || badDomain(z) != "" {
			t.Fatalf("zone %q is not a normalized domain name", z)
		}
	}
	if err := zonesOverlap(cfg.zones); err != nil {
		t.Fatalf("zones %v: %v", cfg.zones, err)
	}
	if cfg.ttl > 86400 || p.ttl != cfg.ttl {
		t.Fatalf("ttl %d, the handler's %d", cfg.ttl, p.ttl)
	}
	if cfg.refresh < minRefresh || cfg.staleAfter != 0 && cfg.staleAfter < minStaleAfter {
		t.Fatalf("refresh %v, stale_after %v under their floors", cfg.refresh, cfg.staleAfter)
	}
	for node, a := range cfg.self {
		if badSelfNode(node) != "" || a.IsValid() && badSelfAddr(a) != "" {
			t.Fatalf("self %q %v", node, a)
		}
	}
	if cfg.allDown != allDownOpen && cfg.allDown != allDownClosed {
		t.Fatalf("all_down %q", cfg.allDown)
	}
	if cfg.checksOn() {
		if cfg.interval < minInterval || cfg.timeout < minTimeout || cfg.timeout >= cfg.interval {
			t.Fatalf("interval %v, timeout %v", cfg.interval, cfg.timeout)
		}
		if cfg.rise < 1 || cfg.rise > maxCount || cfg.fall < 1 || cfg.fall > maxCount {
			t.Fatalf("rise %d, fall %d", cfg.rise, cfg.fall)
		}
	}
	if cfg.maxLag < 0 || cfg.maxLag > 0 && cfg.check != checkPostgres {
		t.Fatalf("max_lag %d with check %q", cfg.maxLag, cfg.check)
	}
	checkApex(t, p, cfg)
	if cfg.redisURL == "" {
		if cfg.redisPrefix != "" || cfg.redisSecret != nil {
			t.Fatalf("redis_prefix %q or a redis_secret without redis", cfg.redisPrefix)
		}
		return
	}
	// Redis without checks serves the registry relay only: with the relay
	// off too, it would serve nothing.
	if !cfg.checksOn() && cfg.relayOff {
		t.Fatal("redis without check, relay off: Redis for nothing")
	}
	if _, err := parseRedisURL(cfg.redisURL); err != nil {
		t.Fatalf("redis URL parsed, then not: %v", err)
	}
	if badRedisPrefix(cfg.redisPrefix) != "" {
		t.Fatalf("redis_prefix %q", cfg.redisPrefix)
	}
	if cfg.redisSecret != nil && len(cfg.redisSecret) < minRedisSecret {
		t.Fatalf("redis_secret of %d bytes", len(cfg.redisSecret))
	}
}

// checkApex fails t unless the ns and soa options of cfg, a parsed stanza,
// are within their bounds and its zones' apexes answer: SOA, NS and the
// addresses of each name server inside a zone, without SERVFAIL, in
// replies that pack.
func checkApex(t *testing.T, p *PgCluster, cfg *settings) {
	t.Helper()
	if o := cfg.soa; o != (soaTimers{}) {
		for _, v := range []uint32{o.refresh, o.retry, o.expire, o.negative} {
			if v < 1 || v > maxSOATimer {
				t.Fatalf("soa %+v: a timer out of 1..2^31-1", o)
			}
		}
		if o.negative > maxNegativeTTL || o.retry >= o.refresh || o.expire <= o.refresh+o.retry {
			t.Fatalf("soa %+v", o)
		}
	}
	seen := map[string]bool{}
	var questions []dns.Question
	for _, z := range cfg.zones {
		questions = append(questions, dns.Question{Name: z, Qtype: dns.TypeSOA}, dns.Question{Name: z, Qtype: dns.TypeNS})
	}
	for _, ns := range cfg.ns {
		if ns.name != strings.ToLower(dns.Fqdn(ns.name)) || badDomain(ns.name) != "" || seen[ns.name] {
			t.Fatalf("ns %q: not a normalized name, or given twice", ns.name)
		}
		seen[ns.name] = true
		in := cfg.inZone(ns.name)
		if slices.Contains(cfg.zones, ns.name) || (in != "") != (len(ns.addrs) > 0) {
			t.Fatalf("ns %q %v in zones %v: an apex, or addresses where none are answered", ns.name, ns.addrs, cfg.zones)
		}
		for _, a := range ns.addrs {
			if !a.IsValid() || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() || a.Is4In6() {
				t.Fatalf("ns %q: address %v", ns.name, a)
			}
		}
		if in != "" {
			questions = append(questions, dns.Question{Name: ns.name, Qtype: dns.TypeA}, dns.Question{Name: ns.name, Qtype: dns.TypeAAAA})
		}
	}
	s := build(buildInput{settings: cfg, nodes: testNodes(), aliases: testAliases})
	s.setSerial(1, cfg.ttl)
	h := &PgCluster{Zones: p.Zones, ttl: p.ttl, Next: test.ErrorHandler()}
	h.pb = publisherOf(s)
	for _, q := range questions {
		m := new(dns.Msg)
		m.SetQuestion(q.Name, q.Qtype)
		rec := dnstest.NewRecorder(&test.ResponseWriter{})
		rcode, _ := h.ServeDNS(context.Background(), rec, m)
		if rcode == dns.RcodeServerFailure || rec.Msg == nil || rec.Msg.Rcode != dns.RcodeSuccess {
			t.Fatalf("%s %s: rcode %d, reply %v", q.Name, dns.TypeToString[q.Qtype], rcode, rec.Msg)
		}
		if _, err := rec.Msg.Pack(); err != nil {
			t.Fatalf("%s %s: the reply does not pack: %v", q.Name, dns.TypeToString[q.Qtype], err)
		}
		if q.Qtype != dns.TypeAAAA && len(rec.Msg.Answer) == 0 && (q.Qtype != dns.TypeA || hasV4(cfg, q.Name)) {
			t.Fatalf("%s %s: no answer\n%v", q.Name, dns.TypeToString[q.Qtype], rec.Msg)
		}
	}
}

// hasV4 reports whether the name server name of cfg has an IPv4 address.
func hasV4(cfg *settings, name string) bool {
	for _, ns := range cfg.ns {
		if ns.name == name {
			return slices.ContainsFunc(ns.addrs, func(a netip.Addr) bool { return a.Is4() })
		}
	}
	return false
}

// max_lag without any check was accepted and did nothing (found by
// FuzzSetup, seed fd643e787402eabb); with check tcp it was refused.
func TestMaxLagWithoutCheck(t *testing.T) {
	block := func(lines ...string) string {
		return "pgcluster {\n postgres " + dsn + "\n " + strings.Join(lines, "\n ") + "\n}"
	}
	runOptionCases(t, []optionCase{
		{block("max_lag 1"), "max_lag needs check postgres", nil},
		{block("check off", "max_lag 16MB"), "max_lag needs check postgres", nil},
		{block("check tcp", "max_lag 16MB"), "max_lag needs check postgres", nil},
		{block("check postgres", "max_lag 16MB"), "", nil},
	})
}
