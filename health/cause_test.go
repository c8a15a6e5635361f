package health

import (
	"net/netip"
	"reflect"
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
	row := func(cols ...string) []*pgconn.Result {
		var bs [][]byte
		for _, c := range cols {
			if c == "NULL" {
				bs = append(bs, nil)
				continue
			}
			bs = append(bs, []byte(c))
		}
		return []*pgconn.Result{{Rows: [][][]byte{bs}}}
	}
	tests := []struct {
		in   []*pgconn.Result
		want result
	}{
		{row("f", "0/3000060", "7", "7714602588950529522", "[]"), result{cause: CauseOK, role: RolePrimary, wal: 0x3000060, tl: 7, sysID: 7714602588950529522, repl: []Replica{}}},
		{row("t", "1/0", "0", "1", "NULL"), result{cause: CauseOK, role: RoleStandby, wal: 1 << 32, sysID: 1}},
		{row("t", "NULL", "0", "5", "NULL"), result{cause: CauseOK, role: RoleStandby, sysID: 5}}, // a standby that has replayed nothing yet
		{row("f", "0/1", "4294967295", "-1", `[["s","::1","sync","0/1",null]]`), result{cause: CauseOK, role: RolePrimary, wal: 1, tl: 1<<32 - 1, sysID: 1<<64 - 1,
			repl: []Replica{{Name: "s", Addr: netip.IPv6Loopback(), Sync: ReplicaSync, ReplayLSN: 1}}}},
		{row("f", "0/1", "1", "1", "[[null,null,null,null,null]]"), result{cause: CauseOK, role: RolePrimary, wal: 1, tl: 1, sysID: 1, replHidden: true}},
	}
	for _, tt := range tests {
		got, err := parseRow(tt.in)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("parseRow(%q) = %+v, %v; want %+v", tt.in[0].Rows, got, err, tt.want)
		}
	}
	for _, bad := range [][]*pgconn.Result{nil, row("f"), row("f", "0/1", "1"), row("f", "0/1", "1", "1"), row("x", "NULL", "1", "1", "NULL"), row("f", "zz", "1", "1", "NULL"),
		row("f", "0/1", "4294967296", "1", "NULL"), row("f", "0/1", "-1", "1", "NULL"), row("f", "0/1", "1", "x", "NULL"), row("f", "0/1", "NULL", "1", "NULL"),
		row("f", "0/1", "1", "1", "[[1]]")} {
		if _, err := parseRow(bad); err == nil {
			t.Errorf("parseRow(%v) succeeded, want an error", bad)
		}
	}
}
