package pgcluster

import (
	"strings"
	"testing"

	"github.com/coredns/caddy"
)

// TestRedisURLWithoutScheme: a redis option given host:port, as redis-cli
// takes it, is answered with the URL to write, never with url.Parse's
// "first path segment in URL cannot contain colon", and never with the
// password.
func TestRedisURLWithoutScheme(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"127.0.0.1:6379", "redis: the URL cannot be used: it has no scheme: write redis://127.0.0.1:6379 (rediss://127.0.0.1:6379 for TLS)"},
		{"redis.internal:6379", "it has no scheme: write redis://redis.internal:6379 (rediss://redis.internal:6379 for TLS)"},
		{"redis.internal", "it has no scheme: write redis://redis.internal (rediss://redis.internal for TLS)"},
		{"[::1]:6379", "it has no scheme: write redis://[::1]:6379 (rediss://[::1]:6379 for TLS)"},
		{":s3cret@127.0.0.1:6379", "it has no scheme: write redis:// before it (rediss:// for TLS)"},
		{"pgcluster:s3cret@redis:6379", "it has no scheme: write redis:// before it (rediss:// for TLS)"},
		{"password=s3cret", "it has no scheme: write redis:// before it (rediss:// for TLS)"},
	} {
		c := caddy.NewTestController("dns", "pgcluster {\n postgres "+dsn+"\n check tcp\n redis "+tc.url+"\n}")
		_, _, err := parse(c)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("redis %s:\n got %v\nwant %q", tc.url, err, tc.want)
		}
	}
}
