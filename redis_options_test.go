package pgcluster

import (
	"strings"
	"testing"
	"time"

	"github.com/coredns/caddy"

	"github.com/redis/go-redis/v9"
)

// secret16 is a redis_secret of the minimum length.
const secret16 = "0123456789abcdef"

func TestSetupRedisOptions(t *testing.T) {
	block := func(lines ...string) string {
		return "pgcluster {\n postgres " + dsn + "\n " + strings.Join(lines, "\n ") + "\n}"
	}
	tests := []optionCase{
		{block(), "", func(t *testing.T, cfg *settings) {
			if cfg.redisURL != "" || cfg.redisPrefix != "" || cfg.redisSecret != nil {
				t.Errorf("defaults: no Redis, no prefix, no secret; got %q %q %q", cfg.redisURL, cfg.redisPrefix, cfg.redisSecret)
			}
		}},
		{block("check tcp", "redis redis://192.0.2.1:6379"), "", func(t *testing.T, cfg *settings) {
			if cfg.redisURL != "redis://192.0.2.1:6379" || cfg.redisPrefix != "pgcluster:pgcluster.lan.:" || cfg.redisSecret != nil {
				t.Errorf("redis: %q, default prefix %q, secret %q", cfg.redisURL, cfg.redisPrefix, cfg.redisSecret)
			}
		}},
		// Order does not matter: check may follow redis.
		{block("redis rediss://dns:pw@redis.example:6380/2", "redis_prefix fleet-a:", "redis_secret "+secret16, "check postgres"), "", func(t *testing.T, cfg *settings) {
			if cfg.redisPrefix != "fleet-a:" || string(cfg.redisSecret) != secret16 {
				t.Errorf("prefix %q, secret %q", cfg.redisPrefix, cfg.redisSecret)
			}
		}},
		{block("check tcp", "redis redis-sentinel://:spw@192.0.2.1:26379?master_name=mymaster&addr=192.0.2.2:26379&password=mpw"), "", nil},
		{block("check tcp", "redis rediss-sentinel://192.0.2.1:26379/1?master_name=mymaster"), "", nil},
		{block("check tcp", "redis redis-cluster://192.0.2.1:7000?addr=192.0.2.2:7000&addr=192.0.2.3:7000"), "", nil},
		{block("check tcp", "redis rediss-cluster://u:pw@192.0.2.1:7000/0"), "", nil},
		{block("check tcp", "redis REDIS://192.0.2.1?read_timeout=2s&dial_timeout=1"), "", nil},
		{block("check tcp", "redis redis://[2001:db8::1]:6379"), "", nil},
		{block("check tcp", "redis redis://h", `redis_prefix "!~:x"`), "", nil},

		// Without check, Redis relays the registry.
		{block("redis redis://h"), "", func(t *testing.T, cfg *settings) {
			if !cfg.relayOn() || cfg.checksOn() {
				t.Errorf("relay on %v, checks on %v", cfg.relayOn(), cfg.checksOn())
			}
		}},
		{block("check tcp", "redis redis://h", "relay off"), "", func(t *testing.T, cfg *settings) {
			if cfg.relayOn() {
				t.Error("relay off: the relay is on")
			}
		}},
		{block("check off", "redis redis://h", "relay off"), "relay off leaves redis nothing to do", nil},
		{block("redis redis://h", "relay maybe"), `relay: "maybe" is neither on nor off`, nil},
		{block("redis redis://h", "relay"), "Wrong argument count", nil},
		{block("relay on"), "relay needs redis URL", nil},
		{block("redis redis://h"), "", func(t *testing.T, cfg *settings) {
			if cfg.relayGrace != defaultRelayGrace {
				t.Errorf("relay_grace %v by default, want %v", cfg.relayGrace, defaultRelayGrace)
			}
		}},
		{block("redis redis://h", "relay_grace 30s"), "", func(t *testing.T, cfg *settings) {
			if cfg.relayGrace != 30*time.Second {
				t.Errorf("relay_grace 30s: %v", cfg.relayGrace)
			}
		}},
		{block("redis redis://h", "relay_grace 0"), "", func(t *testing.T, cfg *settings) {
			if cfg.relayGrace != 0 {
				t.Errorf("relay_grace 0: %v", cfg.relayGrace)
			}
		}},
		{block("redis redis://h", "relay_grace soon"), `relay_grace: "soon" is not a positive duration`, nil},
		{block("redis redis://h", "relay_grace 1s 2s"), "Wrong argument count", nil},
		{block("check tcp", "redis redis://h", "relay off", "relay_grace 5s"), "relay_grace needs the relay", nil},
		{block("relay_grace 5s"), "relay_grace needs redis URL", nil},
		{block("check tcp", "redis_prefix p:"), "redis_prefix needs redis URL", nil},
		{block("check tcp", "redis_secret "+secret16), "redis_secret needs redis URL", nil},
		{block("check tcp", "redis redis://h", "redis redis://i"), "redis: given twice", nil},
		{block("check tcp", "redis redis://h", "redis_prefix a:", "redis_prefix b:"), "redis_prefix: given twice", nil},
		{block("check tcp", "redis redis://h", "redis_secret "+secret16, "redis_secret "+secret16), "redis_secret: given twice", nil},
		{block("check tcp", "redis"), "Wrong argument count", nil},
		{block("check tcp", "redis redis://h redis://i"), "Wrong argument count", nil},
		{block("check tcp", "redis redis://h", "redis_prefix"), "Wrong argument count", nil},
		{block("check tcp", "redis redis://h", "redis_secret"), "Wrong argument count", nil},

		{block("check tcp", "redis http://h:6379"), `redis: the URL cannot be used: scheme "http" is not redis, rediss, redis-sentinel`, nil},
		{block("check tcp", "redis unix:///run/redis.sock"), `scheme "unix" is not redis`, nil},
		{block("check tcp", "redis h:6379"), "redis: the URL cannot be used: it has no scheme: write redis://h:6379", nil},
		{block("check tcp", "redis redis://"), "redis: the URL cannot be used: no host", nil},
		{block("check tcp", "redis redis://:6379/0"), "no host", nil},
		{block("check tcp", "redis redis-sentinel:///?master_name=m"), "no host", nil},
		{block("check tcp", "redis redis-cluster://?addr=h:7000"), "no host", nil},
		{block("check tcp", "redis redis://h:6379/x"), "invalid database number", nil},
		{block("check tcp", "redis redis://h:port"), "redis: the URL cannot be used: it is not a URL: invalid port", nil},
		{block("check tcp", "redis redis://h?colour=blue"), "redis: the URL cannot be used: unexpected option: colour", nil},
		{block("check tcp", "redis redis://h?read_timeout=soon"), "read_timeout", nil},
		{block("check tcp", "redis redis://h?read_timeout=0"), "read_timeout: 0 or less turns the timeout off", nil},
		{block("check tcp", "redis redis-cluster://h?dial_timeout=-1s"), "dial_timeout: 0 or less turns the timeout off", nil},
		{block("check tcp", `redis "redis://h#x"`), "#fragment", nil},
		{block("check tcp", "redis redis://h:65536"), "address h:65536: the port is not a number from 1 to 65535", nil},
		{block("check tcp", "redis redis-sentinel://h:26379?master_name=m&addr=h2:0"), "address h2:0: the port", nil},
		{block("check tcp", "redis redis-cluster://h:7000?addr=h2:x"), "address h2:x: the port", nil},
		{block("check tcp", "redis redis-sentinel://h:26379"), "no master_name: give ?master_name=NAME", nil},
		{block("check tcp", "redis redis-sentinel://h:26379?master_name=m&route_randomly=true"), "route_randomly", nil},
		{block("check tcp", "redis redis-sentinel://h:26379?master_name=m&replica_only=1"), "replica_only", nil},
		{block("check tcp", "redis redis-sentinel://h:26379?master_name=m&addr=nope"), "unable to parse addr param: nope", nil},
		{block("check tcp", "redis redis-cluster://h:7000/3"), `path "/3": Redis Cluster has database 0 only`, nil},
		{block("check tcp", "redis redis-cluster://h:7000?read_only=true"), "read_only", nil},
		{block("check tcp", "redis redis-cluster://h:7000?master_name=m"), "unexpected option: master_name", nil},

		{block("check tcp", "redis redis://h", "redis_prefix fleet{a}:"), `redis_prefix: "fleet{a}:" contains a brace: key names put the backend in a {...} hash tag`, nil},
		{block("check tcp", "redis redis://h", "redis_prefix }"), "contains a brace", nil},
		{block("check tcp", "redis redis://h", `redis_prefix "a b"`), `redis_prefix: "a b" contains ' ': give printable ASCII without spaces`, nil},
		{block("check tcp", "redis redis://h", "redis_prefix caf\u00e9:"), "give printable ASCII", nil},
		{block("check tcp", "redis redis://h", `redis_prefix ""`), `redis_prefix: "" is 0 bytes; give 1 to 200`, nil},
		{block("check tcp", "redis redis://h", "redis_prefix "+strings.Repeat("p", 201)), "is 201 bytes; give 1 to 200", nil},
		{block("check tcp", "redis redis://h", "redis_secret 0123456789abcde"), "redis_secret: 15 bytes is too short: it is the HMAC key that signs every status", nil},
	}
	runOptionCases(t, tests)
}

// TestSetupRedisPrefixDefault: the default prefix is made from the first
// zone, and refused, with a hint, when that zone makes a bad prefix.
func TestSetupRedisPrefixDefault(t *testing.T) {
	c := caddy.NewTestController("dns", "pgcluster b.lan a.lan {\n postgres "+dsn+"\n check tcp\n redis redis://h\n}")
	_, cfg, err := parse(c)
	if err != nil || cfg.redisPrefix != "pgcluster:b.lan.:" {
		t.Errorf("prefix from the first zone: %q, %v", cfg.redisPrefix, err)
	}
	long := strings.Repeat(strings.Repeat("z", 60)+".", 4) + "lan"
	c = caddy.NewTestController("dns", "pgcluster "+long+" {\n postgres "+dsn+"\n check tcp\n redis redis://h\n}")
	if _, _, err := parse(c); err == nil || !strings.Contains(err.Error(), "the default redis_prefix") || !strings.Contains(err.Error(), "give redis_prefix") {
		t.Errorf("a zone too long for the default prefix: %v", err)
	}
	c = caddy.NewTestController("dns", "pgcluster "+long+" {\n postgres "+dsn+"\n check tcp\n redis redis://h\n redis_prefix p:\n}")
	if _, _, err := parse(c); err != nil {
		t.Errorf("with redis_prefix given: %v", err)
	}
}

// TestSetupRedisErrorNamesLine: errors name the plugin, the option and its
// line, also when the fault is found after the block (relay off without
// check).
func TestSetupRedisErrorNamesLine(t *testing.T) {
	for _, tc := range []struct{ input, opt, line string }{
		{"pgcluster {\n postgres " + dsn + "\n check tcp\n redis ftp://h\n}", "redis: the URL cannot be used", ":4 "},
		{"pgcluster {\n postgres " + dsn + "\n redis redis://h\n ttl 5\n relay off\n}", "relay off leaves redis nothing to do", ":5 "},
		{"pgcluster {\n postgres " + dsn + "\n check tcp\n ttl 5\n redis_secret " + secret16 + "\n}", "redis_secret needs redis", ":5 "},
		{"pgcluster {\n postgres " + dsn + "\n redis_prefix p:\n}", "redis_prefix needs redis", ":3 "},
		{"pgcluster {\n postgres " + dsn + "\n check tcp\n redis redis://h\n redis_prefix a{b\n}", "redis_prefix", ":5 "},
	} {
		c := caddy.NewTestController("dns", tc.input)
		c.ServerBlockKeys = []string{"pgcluster.lan.:53"}
		err := setup(c)
		if err == nil || !strings.Contains(err.Error(), "plugin/pgcluster: Testfile"+tc.line) || !strings.Contains(err.Error(), tc.opt) {
			t.Errorf("error should name the plugin, %q and line %s: %v", tc.opt, tc.line, err)
		}
	}
}

// TestSetupRedisErrorHidesPassword: a redis URL that cannot be used is
// refused with the reason, never with a password; nor is a short secret
// shown.
func TestSetupRedisErrorHidesPassword(t *testing.T) {
	for _, u := range []string{
		"http://dns:s3cretpw@h:6379",
		"redis://dns:s3cretpw@h:notaport",
		"redis://dns:s3cretpw@:6379",
		"redis://dns:s3cr%zzetpw@h:6379",
		"redis://dns:s3cret/pw@h:6379",
		"redis://dns:s3cret#pw@h:6379", // the Corefile reads redis://dns:s3cret and a comment
		`"redis://dns:s3cret#pw@h:6379"`,
		"redis://dns:s3cret?pw@h:6379",
		"redis://dns:s3cretpw@h:6379/x",
		"redis://dns:s3cretpw@h:6379?colour=s3cretpw",
		"redis://dns:s3cretpw@h:6379?read_timeout=s3cretpw",
		"redis://dns:s3cretpw@h:6379?pool_fifo=s3cretpw",
		"redis://dns:s3cretpw@h:6379?password=s3cretpw",
		"rediss://dns:s3cretpw@h:6379?read_timeout=0",
		"redis-sentinel://dns:s3cretpw@h:26379?password=s3cretpw",
		"redis-sentinel://h:26379?master_name=m&password=s3cretpw&addr=s3cretpw",
		"redis-sentinel://h:26379?master_name=m&password=s3cret%zz",
		"redis-cluster://dns:s3cretpw@h:7000?addr=dns:s3cretpw@h2",
		"redis-cluster://dns:s3cretpw@h:7000/s3cretpw",
	} {
		c := caddy.NewTestController("dns", "pgcluster {\n postgres "+dsn+"\n check tcp\n redis "+u+"\n}")
		c.ServerBlockKeys = []string{"pgcluster.lan.:53"}
		err := setup(c)
		if err == nil {
			t.Errorf("%s: accepted", u)
			continue
		}
		if !strings.Contains(err.Error(), "redis: the URL cannot be used") || !strings.Contains(err.Error(), ":4 ") {
			t.Errorf("%s: the error should name the option and line 4: %v", u, err)
		}
		if strings.Contains(err.Error(), "s3") {
			t.Errorf("%s: the error shows the password: %v", u, err)
		}
	}
	err := setup(caddy.NewTestController("dns", "pgcluster {\n postgres "+dsn+"\n check tcp\n redis redis://h\n redis_secret s3cretpw\n}"))
	if err == nil || !strings.Contains(err.Error(), "redis_secret: 8 bytes is too short") || strings.Contains(err.Error(), "s3") {
		t.Errorf("short secret: %v", err)
	}
}

// TestParseRedisURL checks what each URL form sets, the sentinels' and the
// master's credentials apart.
func TestParseRedisURL(t *testing.T) {
	rc, err := parseRedisURL("rediss://dns:pw@redis.example:6380/2?client_name=pgc")
	if err != nil {
		t.Fatal(err)
	}
	if o := rc.single; o == nil || o.Addr != "redis.example:6380" || o.Username != "dns" || o.Password != "pw" || o.DB != 2 ||
		o.TLSConfig == nil || o.TLSConfig.ServerName != "redis.example" || o.ClientName != "pgc" || rc.failover != nil || rc.cluster != nil {
		t.Errorf("rediss: %+v", rc)
	}
	rc, err = parseRedisURL("rediss-sentinel://sdns:spw@s1.example:26379/3?master_name=mymaster&addr=s2.example:26379&username=mdns&password=mpw")
	if err != nil {
		t.Fatal(err)
	}
	if o := rc.failover; o == nil || o.MasterName != "mymaster" || strings.Join(o.SentinelAddrs, ",") != "s1.example:26379,s2.example:26379" ||
		o.SentinelUsername != "sdns" || o.SentinelPassword != "spw" || o.Username != "mdns" || o.Password != "mpw" || o.DB != 3 || o.TLSConfig == nil {
		t.Errorf("rediss-sentinel: %+v", rc.failover)
	}
	rc, err = parseRedisURL("redis-cluster://u:pw@n1:7000?addr=n2:7000&addr=[2001:db8::3]:7000")
	if err != nil {
		t.Fatal(err)
	}
	if o := rc.cluster; o == nil || strings.Join(o.Addrs, ",") != "n1:7000,n2:7000,[2001:db8::3]:7000" || o.Username != "u" || o.Password != "pw" || o.TLSConfig != nil {
		t.Errorf("redis-cluster: %+v", rc.cluster)
	}
	rc, err = parseRedisURL("rediss-cluster://n1")
	if err != nil {
		t.Fatal(err)
	}
	if o := rc.cluster; o == nil || strings.Join(o.Addrs, ",") != "n1:6379" || o.TLSConfig == nil || o.TLSConfig.ServerName != "n1" {
		t.Errorf("rediss-cluster: %+v", rc.cluster)
	}
}

// TestNewRedisClient builds each kind of client without connecting: the
// type follows the scheme, context deadlines are always honoured, no
// connection spends a round trip on CLIENT SETINFO, the connections are
// few unless the URL says otherwise, and each dial, read and write is
// bounded by 500ms unless the URL says otherwise.
func TestNewRedisClient(t *testing.T) {
	type opts struct {
		ctx                 bool
		dial, read, write   time.Duration
		failover, isCluster bool
		identity            bool // CLIENT SETINFO on connect
		pool, pipelines     int
	}
	for _, tc := range []struct {
		url  string
		want opts
	}{
		{"redis://192.0.2.1:6379", opts{ctx: true, dial: redisTimeout, read: redisIOTimeout, write: redisIOTimeout, pool: redisPoolSize, pipelines: redisPipelinePoolSize}},
		{"rediss://u:pw@192.0.2.1:6380/1?read_timeout=2s&pool_size=30", opts{ctx: true, dial: redisTimeout, read: 2 * time.Second, write: redisIOTimeout, pool: 30, pipelines: redisPipelinePoolSize}},
		{"redis-sentinel://192.0.2.1:26379?master_name=m&addr=192.0.2.2:26379&dial_timeout=1s", opts{ctx: true, dial: time.Second, read: redisIOTimeout, write: redisIOTimeout, failover: true, pool: redisPoolSize, pipelines: redisPipelinePoolSize}},
		{"rediss-sentinel://192.0.2.1:26379?master_name=m&context_timeout_enabled=false&pipeline_pool_size=5", opts{ctx: true, dial: redisTimeout, read: redisIOTimeout, write: redisIOTimeout, failover: true, pool: redisPoolSize, pipelines: 5}},
		{"redis-cluster://192.0.2.1:7000?addr=192.0.2.2:7000&write_timeout=100ms", opts{ctx: true, dial: redisTimeout, read: redisIOTimeout, write: 100 * time.Millisecond, isCluster: true, pool: redisPoolSize, pipelines: redisPipelinePoolSize}},
		{"rediss-cluster://192.0.2.1:7000", opts{ctx: true, dial: redisTimeout, read: redisIOTimeout, write: redisIOTimeout, isCluster: true, pool: redisPoolSize, pipelines: redisPipelinePoolSize}},
	} {
		rdb, err := newRedisClient(tc.url)
		if err != nil {
			t.Errorf("%s: %v", tc.url, err)
			continue
		}
		var got opts
		switch c := rdb.(type) {
		case *redis.ClusterClient:
			o := c.Options()
			got = opts{o.ContextTimeoutEnabled, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, false, true, !o.DisableIdentity, o.PoolSize, o.PipelinePoolSize}
		case *redis.Client:
			o := c.Options()
			// NewFailoverClient's Options name no server: the sentinels
			// find the master.
			got = opts{o.ContextTimeoutEnabled, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.Addr == "FailoverClient", false, !o.DisableIdentity, o.PoolSize, o.PipelinePoolSize}
		default:
			t.Errorf("%s: a %T", tc.url, rdb)
		}
		if got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.url, got, tc.want)
		}
		if err := rdb.Close(); err != nil {
			t.Errorf("%s: close: %v", tc.url, err)
		}
	}
	if _, err := newRedisClient("redis-sentinel://192.0.2.1:26379"); err == nil || !strings.Contains(err.Error(), "master_name") {
		t.Errorf("a URL refused at parse time is refused here too: %v", err)
	}
}
