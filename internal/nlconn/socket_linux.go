package nlconn

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fdSocket is a blocking netlink socket: one system call to send a
// request, one per datagram received. (vishvananda/netlink's sockets are
// non-blocking and go through the runtime poller, which costs several
// system calls per datagram where system calls are slow.)
type fdSocket struct {
	fd     int
	rcvBuf int // SO_RCVBUF as the kernel set it, for pipelined writes
}

func dialFD(cfg Config) (Socket, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, cfg.Protocol)
	if err != nil {
		return nil, fmt.Errorf("open netlink socket: %w", err)
	}
	tv := unix.NsecToTimeval(cfg.Timeout.Nanoseconds())
	err = errors.Join(
		unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv),
		unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv))
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("set up netlink socket: %w", err)
	}
	if cfg.RcvBuf > 0 {
		// SO_RCVBUFFORCE needs CAP_NET_ADMIN, which the proxy has; without
		// it SO_RCVBUF gets what net.core.rmem_max allows (sizing advice
		// reports a small one). Neither failing is fatal: the dump still
		// works, only with more ENOBUFS restarts under pressure.
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, cfg.RcvBuf) != nil {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, cfg.RcvBuf)
		}
	}
	if cfg.StrictCheck {
		_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	}
	rcvBuf, _ := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
	return &fdSocket{fd: fd, rcvBuf: rcvBuf}, nil
}

// RcvBufSize is the receive buffer the kernel charges queued replies
// against (its truesize accounting), which bounds a pipelined batch.
func (s *fdSocket) RcvBufSize() int { return s.rcvBuf }

func (s *fdSocket) Send(b []byte) error {
	return unix.Sendto(s.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
}

// Recv is recvfrom(2) without a source address, so reading a dump
// allocates nothing (unix.Recvmsg allocates the sender's address on
// every call). MSG_TRUNC makes it return the datagram's real length.
func (s *fdSocket) Recv(b []byte) (int, error) {
	n, _, errno := unix.Syscall6(unix.SYS_RECVFROM, uintptr(s.fd), uintptr(unsafe.Pointer(unsafe.SliceData(b))),
		uintptr(len(b)), unix.MSG_TRUNC, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	if int(n) > len(b) {
		return 0, fmt.Errorf("a %d-byte message does not fit the %d-byte buffer", n, len(b))
	}
	return int(n), nil
}

func (s *fdSocket) Close() error { return unix.Close(s.fd) }

// RcvBuf reports the receive buffer the kernel gave the Conn's socket
// (twice what was asked, for its bookkeeping), for tests and diagnostics.
func (c *Conn) RcvBuf() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.main.sock.(*fdSocket)
	if !ok {
		return 0, errors.New("no open socket")
	}
	return unix.GetsockoptInt(s.fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
}
