package proc

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// A port given out is not given to another process for a while, as a
// CoreDNS binding it with SO_REUSEPORT would share it without an error; an
// old reservation is taken over.
func TestPortReserved(t *testing.T) {
	was := reservations
	reservations = t.TempDir()
	defer func() { reservations = was }()

	if !reserve(40001) {
		t.Fatal("a port never given out was refused")
	}
	if reserve(40001) {
		t.Error("a port just given out was given again")
	}
	old := filepath.Join(reservations, "40002")
	if err := os.WriteFile(old, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	if reserve(40002) {
		t.Error("a port another process reserved a moment ago was given")
	}
	long := time.Now().Add(-2 * reserveFor)
	if err := os.Chtimes(old, long, long); err != nil {
		t.Fatal(err)
	}
	if !reserve(40002) {
		t.Error("a reservation older than reserveFor was not taken over")
	}

	// FreePort reserves each port it gives.
	for range 5 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(reservations, strconv.Itoa(p))); err != nil {
			t.Errorf("port %d given without a reservation: %v", p, err)
		}
		if reserve(p) {
			t.Errorf("port %d given by FreePort was reserved again", p)
		}
	}
}
