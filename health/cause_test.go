package health

import (
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestPgCodeCause(t *testing.T) {
	for code, want := range map[string]string{
		"57P03": CauseStartingUp,
		"57P01": CauseShuttingDown,
		"57P02": CauseShuttingDown,
		"53300": CauseTooManyConnections,
		"28P01": CauseAuthFailed,
		"28000": CauseAuthFailed,
		"42501": CauseAuthFailed,
		"3D000": CauseNoDatabase,
		"08P01": CauseProtocol,
		"53100": CauseError,
		"":      CauseError,
	} {
		if got := pgCodeCause(code); got != want {
			t.Errorf("pgCodeCause(%q) = %q, want %q", code, got, want)
		}
	}
}

func TestParseLSN(t *testing.T) {
	for in, want := range map[string]uint64{
		"0/0":               0,
		"0/3000060":         0x3000060,
		"16/B374D848":       0x16_B374D848,
		"FFFFFFFF/FFFFFFFF": 1<<64 - 1,
	} {
		if got, err := parseLSN(in); err != nil || got != want {
			t.Errorf("parseLSN(%q) = %X, %v; want %X", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "0", "1/2/3", "x/1", "100000000/0", "-1/0"} {
		if _, err := parseLSN(bad); err == nil {
			t.Errorf("parseLSN(%q) succeeded, want an error", bad)
		}
	}
}

func TestParseRow(t *testing.T) {
	row := func(cols ...[]byte) []*pgconn.Result { return []*pgconn.Result{{Rows: [][][]byte{cols}}} }
	tests := []struct {
		in   []*pgconn.Result
		role string
		wal  uint64
	}{
		{row([]byte("f"), []byte("0/3000060")), RolePrimary, 0x3000060},
		{row([]byte("t"), []byte("1/0")), RoleStandby, 1 << 32},
		{row([]byte("t"), nil), RoleStandby, 0}, // a standby that has replayed nothing yet
	}
	for _, tt := range tests {
		role, wal, err := parseRow(tt.in)
		if err != nil || role != tt.role || wal != tt.wal {
			t.Errorf("parseRow(%q) = %q, %X, %v; want %q, %X", tt.in[0].Rows, role, wal, err, tt.role, tt.wal)
		}
	}
	for _, bad := range [][]*pgconn.Result{nil, row([]byte("f")), row([]byte("x"), nil), row([]byte("f"), []byte("zz"))} {
		if _, _, err := parseRow(bad); err == nil {
			t.Errorf("parseRow(%v) succeeded, want an error", bad)
		}
	}
}
