package pgcluster

import (
	"net"
	"net/netip"
	"os"
	"strings"
)

// instanceName is how this instance shows itself next to its tokens in
// Redis, which pgclusterctl status and the other instances' lines name it
// by: its host name and DNS listener, host:port ("dns-2:53") when it
// listens on every address, "host addr:port,..." when bound to some.
func instanceName(host string, listen []string, port string) string {
	var bound []string
	for _, a := range listen {
		if ip, err := netip.ParseAddr(a); a == "" || err == nil && ip.IsUnspecified() {
			continue
		}
		bound = append(bound, net.JoinHostPort(a, port))
	}
	if len(bound) == 0 {
		return host + ":" + port
	}
	return host + " " + strings.Join(bound, ",")
}

// hostName is this host's name, "unknown-host" when it has none.
func hostName() string {
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "unknown-host"
}
