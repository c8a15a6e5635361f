package health

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"testing"
)

// listenersEnv, set in the environment, turns the test binary into the
// listener process of BenchmarkProbeCost (see serveListeners).
const listenersEnv = "HEALTH_BENCH_LISTENERS"

func TestMain(m *testing.M) {
	if n := os.Getenv(listenersEnv); n != "" {
		os.Exit(serveListeners(n))
	}
	os.Exit(m.Run())
}

// serveListeners opens n listeners on 127.0.0.1-127.0.0.10 that accept and
// close every connection, writes their addresses to stdout, one a line, then
// "ready". Each "cpu" line read on stdin is answered with the CPU time used so
// far in nanoseconds; end of input ends the process. The benchmark runs the
// listeners in a process of their own so that its CPU figure is the
// checker's alone.
func serveListeners(n string) int {
	count, err := strconv.Atoi(n)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: %v\n", listenersEnv, n, err)
		return 2
	}
	for i := range count {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.%d:0", 1+i%10))
		if err != nil {
			fmt.Fprintf(os.Stderr, "listener %d: %v\n", i, err)
			return 1
		}
		go acceptAndClose(ln)
		fmt.Println(ln.Addr())
	}
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "cpu" {
			fmt.Println(int64(processCPU()))
		}
	}
	return 0
}

func acceptAndClose(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		conn.Close()
	}
}
