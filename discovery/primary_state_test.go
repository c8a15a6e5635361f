package discovery

import (
	"testing"

	"github.com/miekg/dns"
)

func TestParsePrimaryState(t *testing.T) {
	txt := func(strs ...string) dns.RR {
		return &dns.TXT{Hdr: dns.RR_Header{Name: "primary.local.pgcluster.lan.", Rrtype: dns.TypeTXT, Class: dns.ClassINET}, Txt: strs}
	}
	tests := []struct {
		name      string
		rrs       []dns.RR
		addresses int
		want      PrimaryState
	}{
		{"serving", []dns.RR{txt("state=serving", "node=n1")}, 1, PrimaryState{Status: PrimaryServing, Node: "n1"}},
		{"held", []dns.RR{txt("state=held", "node=n1", "reason=refused")}, 1, PrimaryState{Status: PrimaryHeld, Node: "n1"}},
		{"none", []dns.RR{txt("state=none")}, 0, PrimaryState{Status: PrimaryNone}},
		{"split brain", []dns.RR{txt("state=split_brain", "primaries=3")}, 0, PrimaryState{Status: PrimarySplitBrain, Primaries: 3}},
		{"other strings ignored", []dns.RR{txt("since=2026-01-01", "state=none", "detail=x=y")}, 0, PrimaryState{Status: PrimaryNone}},
		{"absent: an older server", nil, 1, PrimaryState{}},
		{"empty record", []dns.RR{txt()}, 1, PrimaryState{}},
		{"unknown state", []dns.RR{txt("state=maybe")}, 0, PrimaryState{}},
		{"fail open", []dns.RR{txt("state=fail_open", "node=n1", "reason=check_refused")}, 1, PrimaryState{Status: PrimaryFailOpen, Node: "n1"}},
		{"fail open without address", []dns.RR{txt("state=fail_open", "node=n1")}, 0, PrimaryState{}},
		{"a state added later", []dns.RR{txt("state=draining", "node=n1")}, 1, PrimaryState{}},
		{"state twice", []dns.RR{txt("state=none"), txt("state=held", "node=n1")}, 0, PrimaryState{}},
		{"serving without node", []dns.RR{txt("state=serving")}, 1, PrimaryState{}},
		{"held without address", []dns.RR{txt("state=held", "node=n1")}, 0, PrimaryState{}},
		{"none with an address", []dns.RR{txt("state=none")}, 1, PrimaryState{}},
		{"split brain with an address", []dns.RR{txt("state=split_brain", "primaries=2")}, 1, PrimaryState{}},
		{"two nodes", []dns.RR{txt("state=serving", "node=n1", "node=n2")}, 1, PrimaryState{}},
		{"case matters", []dns.RR{txt("STATE=none")}, 0, PrimaryState{}},
	}
	for _, tc := range tests {
		if got := parsePrimaryState(tc.rrs, tc.addresses); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
