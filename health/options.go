package health

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// validateOptions checks the postgres check's Options: libpq key=value
// settings that parse, without host, hostaddr or port (the target gives those)
// and without target_session_attrs (the check reads the role itself).
func validateOptions(opts string) error {
	if strings.HasPrefix(opts, "postgres://") || strings.HasPrefix(opts, "postgresql://") {
		return errors.New("health: Options must be libpq key=value settings, not a URL: write them as \"user=monitor dbname=postgres\", without host and port")
	}
	keys, err := optionKeys(opts)
	if err != nil {
		return fmt.Errorf("health: Options: %w", err)
	}
	for _, k := range keys {
		switch k {
		case "host", "hostaddr", "port":
			return fmt.Errorf("health: Options must not set %q: each target's address and port are probed; remove %s=", k, k)
		case "target_session_attrs":
			return errors.New("health: Options must not set \"target_session_attrs\": the check reads each node's role itself, and would see a node of the other role as down; remove target_session_attrs=")
		}
	}
	// Parse as a probe would, to report bad values (sslmode=bogus, a missing
	// certificate file...) now rather than at every probe.
	if _, err := pgconn.ParseConfig(connString(opts, "127.0.0.1", 5432)); err != nil {
		var pce *pgconn.ParseConfigError
		if errors.As(err, &pce) && errors.Unwrap(pce) != nil {
			err = errors.Unwrap(pce)
		}
		return fmt.Errorf("health: Options: %v", err)
	}
	return nil
}

// connString is opts with the target's host and port added.
func connString(opts, host string, port uint16) string {
	return fmt.Sprintf("%s host=%s port=%d", opts, host, port)
}

// optionKeys returns the keys of libpq key=value settings, following libpq's
// rules: whitespace around "=" is allowed; a value is a run of non-blank
// characters or a single-quoted string; a backslash escapes the next
// character in either.
func optionKeys(s string) ([]string, error) {
	var keys []string
	i := 0
	skip := func() {
		for i < len(s) && isSpace(s[i]) {
			i++
		}
	}
	for {
		skip()
		if i == len(s) {
			return keys, nil
		}
		start := i
		for i < len(s) && s[i] != '=' && !isSpace(s[i]) {
			i++
		}
		key := s[start:i]
		skip()
		if i == len(s) || s[i] != '=' {
			return nil, fmt.Errorf("missing \"=\" after %q: write key=value settings separated by spaces", key)
		}
		i++
		skip()
		if i < len(s) && s[i] == '\'' {
			i++
			for i < len(s) && s[i] != '\'' {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			if i >= len(s) {
				return nil, fmt.Errorf("the quoted value of %q has no closing quote", key)
			}
			i++
		} else {
			for i < len(s) && !isSpace(s[i]) {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			i = min(i, len(s)) // a trailing backslash escapes nothing
		}
		keys = append(keys, key)
	}
}

func isSpace(b byte) bool {
	return b == ' ' || b == '\t' || b == '\n' || b == '\r' || b == '\f' || b == '\v'
}
