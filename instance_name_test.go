package pgcluster

import (
	"context"
	"regexp"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// TestInstanceName: an instance shows itself as its host and DNS
// listener: host:port when it listens on every address, the addresses
// bound otherwise.
func TestInstanceName(t *testing.T) {
	for _, tc := range []struct {
		listen []string
		port   string
		want   string
	}{
		{[]string{""}, "53", "dns-2:53"},
		{nil, "1053", "dns-2:1053"},
		{[]string{"0.0.0.0"}, "53", "dns-2:53"},
		{[]string{"::"}, "53", "dns-2:53"},
		{[]string{"127.0.0.1"}, "1053", "dns-2 127.0.0.1:1053"},
		{[]string{"10.0.0.2", "2001:db8::2"}, "53", "dns-2 10.0.0.2:53,[2001:db8::2]:53"},
	} {
		if got := instanceName("dns-2", tc.listen, tc.port); got != tc.want {
			t.Errorf("instanceName(dns-2, %q, %s) = %q, want %q", tc.listen, tc.port, got, tc.want)
		}
	}
}

// TestTokensNamedInLogs: where an instance logs a token of its own in
// Redis (its fleet membership, its registry relay), its host and DNS
// listener follow, so that a token seen in pgclusterctl status or in
// another instance's log leads to a host; a line naming another
// instance's token says where to look for it.
func TestTokensNamedInLogs(t *testing.T) {
	log := captureLog(t)
	rs := redistest.Start(t)
	set := redisCheckSettings(rs.URL())
	set.instance = "dns-2:53"
	runChecks(t, set)
	line := loggedLine(t, log, "Redis: this instance is fleet member ")
	if !regexp.MustCompile(`Redis: this instance is fleet member [0-9a-f]{8} \(dns-2:53\); its full token is [0-9a-f]{32}$`).MatchString(line) {
		t.Errorf("member line: %s", line)
	}

	pg := pgtest.New(t)
	pg.MustExec(t, Schema)
	relaySet := func(instance string) *settings {
		return &settings{zones: []string{testZone}, dsn: pg.DSN(""), ttl: 5, refresh: time.Hour,
			redisURL: rs.URL(), redisPrefix: "names:", instance: instance}
	}
	startRelay(t, relaySet("dns-1:53"))
	line = loggedLine(t, log, "Registry relay: took the registry lease")
	if !regexp.MustCompile(`Registry relay: took the registry lease as instance [0-9a-f]{8} \(dns-1:53\): following PostgreSQL for the fleet`).MatchString(line) {
		t.Errorf("follower line: %s", line)
	}
	holder := regexp.MustCompile(`as instance ([0-9a-f]{8})`).FindStringSubmatch(line)[1]
	startRelay(t, relaySet("dns-3:53"))
	line = loggedLine(t, log, "Registry relay: reading the registry from Redis")
	if want := "instance " + holder + " follows PostgreSQL for the fleet (its log names its host: \"took the registry lease as instance " + holder + "\")"; !regexp.MustCompile(regexp.QuoteMeta(want) + "$").MatchString(line) {
		t.Errorf("reader line: %s\nwant it to end in %s", line, want)
	}
}

// startRelay starts a relaying instance with set until the test ends.
func startRelay(t *testing.T, set *settings) *relay {
	t.Helper()
	r, err := newRelay(set, newPublisher(set, nil, false), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go r.run(ctx)
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}
