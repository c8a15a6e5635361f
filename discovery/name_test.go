package discovery

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckName(t *testing.T) {
	long := strings.Repeat("a", 70)
	tests := []struct {
		name string
		want string // in the error; "" for none
	}{
		{name: "local.pgcluster.lan"},
		{name: "local.pgcluster.lan."},
		{name: "_postgresql._tcp.prefer-standby.local.pgcluster.lan"},
		{name: strings.Repeat("a", 63) + ".lan"},
		{name: strings.Repeat("abcdefghi.", 25) + "abc"}, // 253 bytes
		{name: "127.0.0.9"},
		{name: "::1"},
		{name: "", want: "empty"},
		{name: ".", want: "empty"},
		{name: long + ".pgcluster.lan", want: "is 70 bytes long, the most is 63"},
		{name: strings.Repeat("abcdefghi.", 25) + "abcd", want: "254 bytes long, the most is 253"},
		{name: "a..pgcluster.lan", want: "empty label"},
		{name: ".pgcluster.lan", want: "empty label"},
		{name: "local.pgcluster.lan:5433", want: "has a port (5433)"},
		{name: "[::1]:5432", want: "has a port (5432)"},
		{name: "local pgcluster.lan", want: "character ' ' is not allowed"},
		{name: "lo\\cal.lan", want: "character '\\\\' is not allowed"},
	}
	for _, tc := range tests {
		err := CheckName(tc.name)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("CheckName(%q): %v", tc.name, err)
		case tc.want != "" && (!errors.Is(err, ErrBadName) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("CheckName(%q) = %v, want ErrBadName saying %q", tc.name, err, tc.want)
		}
	}
}

// A bad name is refused before any query, by Resolve, Discover and Watch,
// instead of "dns: bad rdata" or a query for "host:port".
func TestBadNameSendsNoQuery(t *testing.T) {
	c := newCluster(t, 0)
	cl := c.client(t, Config{})
	for _, name := range []string{strings.Repeat("a", 70) + ".pgcluster.lan", "local.pgcluster.lan:5432"} {
		if _, err := cl.Resolve(t.Context(), name); !errors.Is(err, ErrBadName) {
			t.Errorf("Resolve(%q): %v, want ErrBadName", name, err)
		}
		if _, err := cl.Discover(t.Context(), name); !errors.Is(err, ErrBadName) {
			t.Errorf("Discover(%q): %v, want ErrBadName", name, err)
		}
		if _, err := cl.Watch(t.Context(), name, WatchOptions{}); !errors.Is(err, ErrBadName) {
			t.Errorf("Watch(%q): %v, want ErrBadName", name, err)
		}
	}
	if n := c.dns.Queries(); n != 0 {
		t.Errorf("%d queries sent for bad names", n)
	}
}
