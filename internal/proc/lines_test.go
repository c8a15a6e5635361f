package proc

import (
	"bytes"
	"testing"
)

// A LineWriter writes lines whole, each after the prefix, and keeps a line
// not ended yet until its end comes.
func TestLineWriter(t *testing.T) {
	var b bytes.Buffer
	p := &LineWriter{W: &b, Prefix: "coredns-1: "}
	p.Write([]byte("one\ntw"))
	p.Write([]byte("o\nListen: listen tcp 127.0.0.1:1: bind: address already in use\npartial"))
	if want := "coredns-1: one\ncoredns-1: two\ncoredns-1: Listen: listen tcp 127.0.0.1:1: bind: address already in use\n"; b.String() != want {
		t.Errorf("the line writer wrote %q, want %q", b.String(), want)
	}
}
