package test

import (
	"fmt"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pgcluster/pgcluster"
	"github.com/pgcluster/pgcluster/internal/coretest"
	"github.com/pgcluster/pgcluster/internal/pgtest"
	"github.com/pgcluster/pgcluster/internal/redistest"
)

// TestSecuritySecretsNotLogged runs a fleet of two bin/coredns whose
// Corefile holds a DSN password (checked by scram-sha-256), a Redis URL
// password (an ACL user's) and a redis_secret, with the log and errors
// plugins on, through everything that logs: start-up, queries, a flip, a
// registry outage, a Redis outage during which the Redis user is gone (its
// password refused), a Corefile reload; and starts instances whose DSN or
// Redis URL cannot be parsed, each with the password in it. No log line
// and no /metrics output, scraped in every state, holds any of the three
// secrets, raw or encoded.
func TestSecuritySecretsNotLogged(t *testing.T) {
	const interval, timeout = 200 * time.Millisecond, 100 * time.Millisecond
	ctx := Ctx(t)
	// Reserved characters, so that an encoded form is also looked for.
	pgPass := "dsn/pw+" + coretest.RandomHex(10)
	redisPass := "redis@pw#" + coretest.RandomHex(10)
	secret := "redis-secret-" + coretest.RandomHex(16)
	secrets := map[string][]string{}
	for name, s := range map[string]string{"DSN password": pgPass, "Redis password": redisPass, "redis_secret": secret} {
		secrets[name] = []string{s, url.QueryEscape(s), url.PathEscape(s), strings.TrimPrefix(url.UserPassword("", s).String(), ":")}
	}

	pg := pgtest.New(t)
	pg.MustExec(t, pgcluster.Schema)
	pg.MustExec(t, fmt.Sprintf("CREATE ROLE dns LOGIN PASSWORD '%s'; GRANT SELECT ON pgcluster_nodes, pgcluster_aliases TO dns", pgPass))
	if err := pg.PrependHBA(ctx, "host all dns 127.0.0.0/8 scram-sha-256"); err != nil {
		t.Fatal(err)
	}
	var bs []*fleetBackend
	for i := range 2 {
		b := openFleetBackend(t, fmt.Sprintf("127.0.0.%d", 51+i))
		bs = append(bs, b)
		pg.MustExec(t, fmt.Sprintf("INSERT INTO pgcluster_nodes(name, address, port, role) VALUES ('n%d', '%s', %s, 'standby')", i, b.host, b.port))
	}
	hosts := []string{bs[0].host, bs[1].host}

	rs := redistest.Start(t)
	admin := rs.Client(t)
	addUser := func() error {
		return admin.Do(ctx, "ACL", "SETUSER", "pgcluster", "reset", "on", ">"+redisPass, "~*", "&*", "+@all").Err()
	}
	if err := addUser(); err != nil {
		t.Fatal(err)
	}

	dsn := (&url.URL{Scheme: "postgres", User: url.UserPassword("dns", pgPass), Host: fmt.Sprintf("%s:%d", pg.Host, pg.Port),
		Path: "/postgres", RawQuery: "sslmode=disable"}).String()
	redisURL := (&url.URL{Scheme: "redis", User: url.UserPassword("pgcluster", redisPass), Host: rs.Addr()}).String()
	corefile := func(dsn, redisURL string) string {
		return fmt.Sprintf(`%s:%s {
 bind 127.0.0.1
 log
 errors
 prometheus 127.0.0.1:%s
 pgcluster {
  postgres %q
  allow_loopback
  check tcp
  interval %s
  timeout %s
  rise 1
  fall 1
  redis %q
  redis_secret %s
 }
}
`, Zone, PortPlaceholder, MetricsPlaceholder, dsn, interval, timeout, redisURL, secret)
	}

	var scraped []string // /metrics bodies, in every state
	scrape := func(ins []*Instance) {
		for _, in := range ins {
			body, err := get(in.MetricsURL())
			if err != nil {
				t.Fatalf("metrics of %s: %v", in.Addr(), err)
			}
			scraped = append(scraped, body)
		}
	}
	ins := startInstances(t, corefile(dsn, redisURL), 2)
	Eventually(t, 20*time.Second, coordinated(t, ins, 2))
	Eventually(t, 10*time.Second, answersExactly(ins, hosts))
	scrape(ins)

	bs[0].Close()
	Eventually(t, 10*time.Second, answersExactly(ins, hosts[1:]))
	bs[0].Open(t)
	Eventually(t, 10*time.Second, answersExactly(ins, hosts))

	// The registry away and back.
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, in := range ins {
		Eventually(t, 10*time.Second, metricIs(t, in, registryUp, 0))
		// The registry's absence logged, by its follower as unreachable,
		// or, by an instance that took the relay's lease meanwhile and
		// never had a session, as the lease given up: the lines whose
		// secrets are checked below.
		Eventually(t, 5*time.Second, func() error {
			for l := range strings.SplitSeq(in.Log(), "\n") {
				if containsAll(l, []string{"Registry", "unreachable"}) || containsAll(l, []string{"Registry relay", "no registry session"}) {
					return nil
				}
			}
			return fmt.Errorf("no log line of %s says the registry is unreachable or its session missing", in.Addr())
		})
	}
	scrape(ins)
	if err := pg.Start(); err != nil {
		t.Fatal(err)
	}
	for _, in := range ins {
		Eventually(t, 15*time.Second, metricIs(t, in, registryUp, 1))
	}

	// Redis away, then back without the user: its password is refused.
	rs.Stop()
	for _, in := range ins {
		Eventually(t, 10*time.Second, metricIs(t, in, modeLocal, 1))
	}
	if err := rs.Start(); err != nil {
		t.Fatal(err)
	}
	// Whichever instance's call meets the refusal first says so.
	Eventually(t, 10*time.Second, func() error {
		for _, in := range ins {
			if strings.Contains(in.Log(), "WRONGPASS") {
				return nil
			}
		}
		return fmt.Errorf("no instance logged Redis refusing its password")
	})
	scrape(ins)
	if err := addUser(); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 20*time.Second, coordinated(t, ins, 2))

	// A Corefile reload (SIGUSR1) starts the plugin again with the same secrets.
	if err := syscall.Kill(ins[1].Pid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitLogged(t, ins[1], 10*time.Second, "Reloading complete")
	Eventually(t, 20*time.Second, coordinated(t, ins, 2))
	Eventually(t, 10*time.Second, answersExactly(ins, hosts))
	scrape(ins)

	// Start-up refused: the password is in what cannot be parsed.
	badDSN := strings.Replace(dsn, fmt.Sprint(pg.Port), "notaport", 1)
	badRedis := strings.Replace(redisURL, rs.Addr(), "127.0.0.1:notaport", 1)
	refused := []*Instance{
		StartFleetInstanceNoWait(t, corefile(badDSN, redisURL)),
		StartFleetInstanceNoWait(t, corefile(dsn, badRedis)),
		StartFleetInstanceNoWait(t, corefile(dsn, strings.Replace(redisURL, "redis://", "rediz://", 1))),
	}
	for _, in := range refused {
		Eventually(t, 20*time.Second, func() error {
			if !in.Exited() {
				return fmt.Errorf("the instance with an unparsable option is still running")
			}
			return nil
		})
		if !strings.Contains(in.Log(), "Error during parsing") {
			t.Errorf("an instance with an unparsable option exited without a parse error:\n%s", in.Log())
		}
	}

	all := append(ins, refused...)
	lines := 0
	for _, in := range all {
		for l := range strings.SplitSeq(in.Log(), "\n") {
			lines++
			for name, forms := range secrets {
				for _, f := range forms {
					if strings.Contains(l, f) {
						t.Errorf("the %s is in a log line of %s: %q", name, in.Addr(), l)
					}
				}
			}
		}
	}
	for _, body := range scraped {
		for name, forms := range secrets {
			for _, f := range forms {
				if strings.Contains(body, f) {
					t.Errorf("the %s is in the metrics", name)
				}
			}
		}
	}
	t.Logf("%d log lines of %d instances and %d /metrics outputs hold none of the three secrets", lines, len(all), len(scraped))
}
