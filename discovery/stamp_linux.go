package discovery

import (
	"io"
	"net"
	"syscall"
	"time"
	"unsafe"
)

// The PostgreSQL probe times the reply by the kernel's receive timestamp
// (SO_TIMESTAMPNS), not by when the probing goroutine got to read it: on a
// busy machine that can be many milliseconds later, and the same for every
// candidate whose reply arrived meanwhile, which would scramble the ranking.

// stampControl asks the kernel to timestamp what the socket receives.
func stampControl(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

// readStamped reads into b (at least one byte) and returns when the kernel
// received it, or when the read returned if the kernel did not say.
func readStamped(conn net.Conn, b []byte) (time.Time, error) {
	tc, ok := conn.(*net.TCPConn)
	if !ok {
		return readPlain(conn, b)
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return time.Time{}, err
	}
	var (
		n, oobn int
		rerr    error
		oob     = make([]byte, syscall.CmsgSpace(int(unsafe.Sizeof(syscall.Timespec{}))))
	)
	err = rc.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), b, oob, 0)
		return rerr != syscall.EAGAIN && rerr != syscall.EINTR
	})
	now := time.Now()
	switch {
	case err != nil:
		return time.Time{}, err
	case rerr != nil:
		return time.Time{}, &net.OpError{Op: "read", Net: "tcp", Err: rerr}
	case n == 0:
		return time.Time{}, io.ErrUnexpectedEOF
	}
	if at, ok := rxTimestamp(oob[:oobn]); ok {
		return at, nil
	}
	return now, nil
}

// rxTimestamp finds the SCM_TIMESTAMPNS control message.
func rxTimestamp(oob []byte) (time.Time, bool) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return time.Time{}, false
	}
	for _, m := range msgs {
		if m.Header.Level == syscall.SOL_SOCKET && m.Header.Type == syscall.SCM_TIMESTAMPNS &&
			len(m.Data) >= int(unsafe.Sizeof(syscall.Timespec{})) {
			ts := (*syscall.Timespec)(unsafe.Pointer(&m.Data[0]))
			return time.Unix(ts.Unix()), true
		}
	}
	return time.Time{}, false
}
