package nlconn

import (
	"errors"
	"fmt"
	"runtime"
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
	// The headers RecvMulti hands recvmmsg, made on first use and kept.
	hdrs []mmsghdr
	iovs []unix.Iovec
}

// mmsghdr is struct mmsghdr: a message header and the length received.
// Go pads it to its alignment as C does.
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
}

func dialFD(cfg Config) (Socket, error) {
	fd, err := openSocket(cfg)
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

// openSocket makes the netlink socket, in cfg.NetNS when set: the
// calling thread enters the namespace for the one system call and
// leaves it again; a thread that could not leave is never reused (it
// ends with the goroutine locked to it).
func openSocket(cfg Config) (int, error) {
	open := func() (int, error) {
		return unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, cfg.Protocol)
	}
	if cfg.NetNS == 0 {
		return open()
	}
	runtime.LockOSThread()
	own, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("read this thread's network namespace: %w", err)
	}
	defer unix.Close(own)
	if err := unix.Setns(cfg.NetNS, unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return -1, fmt.Errorf("enter network namespace: %w", err)
	}
	fd, err := open()
	if unix.Setns(own, unix.CLONE_NEWNET) == nil {
		runtime.UnlockOSThread()
	}
	return fd, err
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

// RecvMulti reads up to len(lens) datagrams in one recvmmsg(2), the
// i-th into buf[i*slot:(i+1)*slot], its length into lens[i]: the
// acknowledgements of a pipelined batch, all queued by the time the send
// returned, cost one system call instead of one each. It waits (up to
// the socket's timeout) for the first only (MSG_WAITFORONE). A datagram
// longer than slot is reported with its real length (MSG_TRUNC), for the
// caller to refuse.
func (s *fdSocket) RecvMulti(buf []byte, slot int, lens []int) (int, error) {
	n := len(lens)
	if len(s.hdrs) < n {
		s.hdrs, s.iovs = make([]mmsghdr, n), make([]unix.Iovec, n)
	}
	for i := range n {
		s.iovs[i].Base = &buf[i*slot]
		s.iovs[i].SetLen(slot)
		s.hdrs[i] = mmsghdr{}
		s.hdrs[i].hdr.Iov = &s.iovs[i]
		s.hdrs[i].hdr.SetIovlen(1)
	}
	got, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&s.hdrs[0])),
		uintptr(n), unix.MSG_WAITFORONE|unix.MSG_TRUNC, 0, 0)
	if errno != 0 {
		return 0, errno
	}
	for i := range int(got) {
		lens[i] = int(s.hdrs[i].len)
	}
	return int(got), nil
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
