package health

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"
)

// A probe with a source address goes out from it (a backend that allows
// one of the host's addresses sees that one), and one to a target of the
// other family goes out as the system chooses.
func TestProbeSource(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	from := make(chan netip.Addr, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			from <- c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			c.Close()
		}
	}()
	addr := ln.Addr().(*net.TCPAddr).AddrPort()
	ctx := context.Background()
	for _, source := range []string{"127.0.0.23", "127.0.0.24"} {
		src := netip.MustParseAddr(source)
		if r := tcpProbe(time.Second, src)(ctx, addr); r.cause != CauseOK {
			t.Fatalf("probe from %s: %s %s", src, r.cause, r.detail)
		}
		if got := <-from; got != src {
			t.Errorf("probe from %s arrived from %s", src, got)
		}
	}
	if r := tcpProbe(time.Second, netip.MustParseAddr("::1"))(ctx, addr); r.cause != CauseOK {
		t.Fatalf("probe with a source of the other family: %s %s", r.cause, r.detail)
	}
	if got := <-from; got != netip.MustParseAddr("127.0.0.1") {
		t.Errorf("probe with a source of the other family arrived from %s, want the system's choice", got)
	}
}
