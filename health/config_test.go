package health

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestNewValidates(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string // in the error
	}{
		{Config{}, `Check "" is not a check`},
		{Config{Check: "http"}, `Check "http"`},
		{Config{Check: CheckTCP, Interval: -time.Second}, "Interval"},
		{Config{Check: CheckTCP, Timeout: -1}, "Timeout"},
		{Config{Check: CheckTCP, Rise: -1}, "Rise"},
		{Config{Check: CheckTCP, Fall: -2}, "Fall"},
		{Config{Check: CheckTCP, Options: "user=x"}, "Options are for the postgres check only"},
		{Config{Check: CheckPostgres, Options: "user=monitor host=10.0.0.1"}, `must not set "host"`},
		{Config{Check: CheckPostgres, Options: "hostaddr = 10.0.0.1"}, `must not set "hostaddr"`},
		{Config{Check: CheckPostgres, Options: "dbname=postgres port='5433'"}, `must not set "port"`},
		{Config{Check: CheckPostgres, Options: "target_session_attrs=read-write"}, `must not set "target_session_attrs"`},
		{Config{Check: CheckPostgres, Options: "postgres://monitor@db/postgres"}, "not a URL"},
		{Config{Check: CheckPostgres, Options: "user"}, `missing "=" after "user"`},
		{Config{Check: CheckPostgres, Options: "password='abc"}, "no closing quote"},
		{Config{Check: CheckPostgres, Options: "sslmode=sometimes"}, "sslmode"},
	}
	for _, tt := range tests {
		_, err := New(tt.cfg)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("New(%+v) = %v, want an error with %q", tt.cfg, err, tt.want)
		}
	}
}

func TestNewDefaults(t *testing.T) {
	c := mustNew(t, Config{Check: CheckPostgres, Options: "user=monitor dbname=postgres sslmode=prefer application_name='pg cluster' password='it\\'s'"})
	want := Config{Check: CheckPostgres, Interval: 2 * time.Second, Timeout: time.Second, Rise: 2, Fall: 2}
	got := c.cfg
	got.Options = ""
	if got.Check != want.Check || got.Interval != want.Interval || got.Timeout != want.Timeout || got.Rise != want.Rise || got.Fall != want.Fall {
		t.Errorf("defaults: got %+v, want %+v", got, want)
	}
}

func TestOptionKeys(t *testing.T) {
	tests := map[string][]string{
		"":                                     nil,
		"user=a dbname=b":                      {"user", "dbname"},
		"  user = a\tdbname= 'b c'  ":          {"user", "dbname"},
		`password='x\' host=y' sslmode=prefer`: {"password", "sslmode"}, // host is inside the quoted value
		`password=x\ host=y`:                   {"password"},            // the escaped blank joins host=y to the value
		`password=x\`:                          {"password"},
	}
	for in, want := range tests {
		got, err := optionKeys(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("optionKeys(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
}
