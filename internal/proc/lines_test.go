package proc

import (
	"bytes"
	"regexp"
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

// With Stamp, each line begins with the time it ended, before the prefix.
func TestLineWriterStamp(t *testing.T) {
	var b bytes.Buffer
	p := &LineWriter{W: &b, Prefix: "coredns-1: ", Stamp: true}
	p.Write([]byte("one\ntwo\npartial"))
	if !regexp.MustCompile(`^(\d\d:\d\d:\d\d\.\d{3} coredns-1: (one|two)\n){2}$`).MatchString(b.String()) {
		t.Errorf("the line writer wrote %q, want two stamped lines", b.String())
	}
}
