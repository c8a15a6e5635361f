package pgcluster

import "testing"

func TestOutboundAddrs(t *testing.T) {
	v4, v6 := outboundAddrs()
	for _, a := range []struct {
		ok   bool
		name string
	}{{v4.IsValid(), "v4"}, {v6.IsValid(), "v6"}} {
		t.Logf("outbound %s found: %v", a.name, a.ok)
	}
	if v4.IsValid() && (v4.IsLoopback() || !v4.Is4()) {
		t.Errorf("outbound IPv4 %v must be a non-loopback IPv4 address", v4)
	}
	if v6.IsValid() && (v6.IsLoopback() || !v6.Is6()) {
		t.Errorf("outbound IPv6 %v must be a non-loopback IPv6 address", v6)
	}
}
