package printable

import "testing"

func TestCut(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
	}{
		{"dns-1.example.com:53", 200, "dns-1.example.com:53"},
		{"dns-2:53\x1b[2J", 200, "dns-2:53?[2J"},
		{`a"b\c` + "\u00e9", 200, "a?b?c??"},
		{"primary", 3, "pri"},
		{"", 5, ""},
	} {
		if got := Cut(tc.in, tc.max); got != tc.want {
			t.Errorf("Cut(%q, %d) = %q, want %q", tc.in, tc.max, got, tc.want)
		}
	}
}
