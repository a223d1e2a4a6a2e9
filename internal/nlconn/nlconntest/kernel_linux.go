// Package nlconntest is a scripted netlink kernel for testing code that
// sends requests and reads dumps through nlconn: each request is
// answered with datagrams (or receive errors) a test builds for the
// request's sequence number, so multi-part dumps, interrupted dumps,
// error acknowledgements, lost messages and timeouts can all be fed to
// the real receive loop.
package nlconntest

import (
	"encoding/binary"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
)

// Answer returns what the kernel sends back for request n (counted from
// 0 over the Conn's life, across sockets) sent with sequence number seq
// and serialized as req: each element a datagram ([]byte) or an error
// the receive returns (unix.EINTR, unix.ENOBUFS). When the script runs
// out, receives time out (EAGAIN), as with SO_RCVTIMEO. A datagram of
// several messages (a pipelined batch) is several requests, answered
// one after the other, as the kernel's netlink_rcv_skb does.
type Answer func(n int, seq uint32, req []byte) []any

// Kernel counts what the Conn did with its sockets.
type Kernel struct {
	t      testing.TB
	answer Answer

	mu     sync.Mutex
	Reqs   [][]byte // every request sent, serialized
	Sends  int      // datagrams sent: one per request, or per pipelined batch
	Dials  int      // sockets opened
	Closes int      // sockets closed
	Recvs  int      // receive system calls: one per datagram, or per recvmmsg
	// RcvBuf is the receive buffer the sockets report (0: they report
	// none, and the Conn assumes the kernel's default).
	RcvBuf int
	// NoRecvMulti makes the sockets opened after it is set read one
	// datagram per receive, as without recvmmsg.
	NoRecvMulti bool
	pending     []any
}

// New returns a Conn whose sockets talk to a Kernel following answer.
func New(t testing.TB, answer Answer) (*nlconn.Conn, *Kernel) {
	k := &Kernel{t: t, answer: answer}
	c := nlconn.NewConn(nlconn.Config{Timeout: time.Second}, func() (nlconn.Socket, error) {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.Dials++
		k.pending = nil // a new socket has nothing queued
		if k.NoRecvMulti {
			return &socket{k: k}, nil
		}
		return &multiSocket{socket{k: k}}, nil
	})
	return c, k
}

// ExpectRequests compares every request sent so far, each printed by
// text (a test's decoder of its protocol), with want, in order.
func (k *Kernel) ExpectRequests(text func(req []byte) string, want []string) {
	k.t.Helper()
	k.mu.Lock()
	reqs := slices.Clone(k.Reqs)
	k.mu.Unlock()
	if len(reqs) != len(want) {
		k.t.Fatalf("%d requests, want %d", len(reqs), len(want))
	}
	for i, req := range reqs {
		if got := text(req); got != want[i] {
			k.t.Errorf("request %d:\n%s\nwant\n%s", i, got, want[i])
		}
	}
}

// SendCount returns the datagrams sent: the round trips.
func (k *Kernel) SendCount() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.Sends
}

// Counts returns requests sent, sockets opened and sockets closed.
func (k *Kernel) Counts() (reqs, dials, closes int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.Reqs), k.Dials, k.Closes
}

type socket struct {
	k      *Kernel
	closed bool
}

func (s *socket) Send(b []byte) error {
	k := s.k
	k.mu.Lock()
	defer k.mu.Unlock()
	if s.closed {
		k.t.Error("send on a closed socket")
	}
	k.Sends++
	for len(b) >= unix.NLMSG_HDRLEN {
		l := min(int(binary.NativeEndian.Uint32(b)), len(b))
		req := b[:l]
		seq := binary.NativeEndian.Uint32(req[8:])
		n := len(k.Reqs)
		k.Reqs = append(k.Reqs, slices.Clone(req))
		k.pending = append(k.pending, k.answer(n, seq, req)...)
		b = b[min((l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1), len(b)):]
	}
	return nil
}

// multiSocket reads several datagrams per receive, as recvmmsg does.
type multiSocket struct{ socket }

// RecvMulti hands over the datagrams queued, up to len(lens), the i-th
// into buf[i*slot:]: a receive error is returned when it comes first,
// else left for the next call, as recvmmsg with MSG_WAITFORONE does. A
// datagram longer than slot is cut, its real length reported.
func (s *multiSocket) RecvMulti(buf []byte, slot int, lens []int) (int, error) {
	k := s.k
	k.mu.Lock()
	defer k.mu.Unlock()
	k.Recvs++
	n := 0
	for n < len(lens) && len(k.pending) > 0 {
		if _, isErr := k.pending[0].(error); isErr && n > 0 {
			break
		}
		if d, ok := k.pending[0].([]byte); ok {
			lens[n] = len(d)
		}
		if _, err := s.recvLocked(buf[n*slot : (n+1)*slot]); err != nil {
			return 0, err
		}
		n++
	}
	if n == 0 {
		return 0, unix.EAGAIN
	}
	return n, nil
}

// RcvBufSize reports Kernel.RcvBuf, as a real socket its SO_RCVBUF.
func (s *socket) RcvBufSize() int {
	s.k.mu.Lock()
	defer s.k.mu.Unlock()
	return s.k.RcvBuf
}

func (s *socket) Recv(b []byte) (int, error) {
	k := s.k
	k.mu.Lock()
	defer k.mu.Unlock()
	k.Recvs++
	return s.recvLocked(b)
}

func (s *socket) recvLocked(b []byte) (int, error) {
	k := s.k
	if s.closed {
		k.t.Error("recv on a closed socket")
	}
	if len(k.pending) == 0 {
		return 0, unix.EAGAIN
	}
	next := k.pending[0]
	k.pending = k.pending[1:]
	if err, ok := next.(error); ok {
		return 0, err
	}
	return copy(b, next.([]byte)), nil
}

func (s *socket) Close() error {
	s.k.mu.Lock()
	defer s.k.mu.Unlock()
	s.closed = true
	s.k.Closes++
	return nil
}

// Msg builds one netlink message, padded as the kernel pads it.
func Msg(typ, flags uint16, seq uint32, payload []byte) []byte {
	l := unix.NLMSG_HDRLEN + len(payload)
	b := make([]byte, (l+unix.NLMSG_ALIGNTO-1)&^(unix.NLMSG_ALIGNTO-1))
	binary.NativeEndian.PutUint32(b, uint32(l))
	binary.NativeEndian.PutUint16(b[4:], typ)
	binary.NativeEndian.PutUint16(b[6:], flags)
	binary.NativeEndian.PutUint32(b[8:], seq)
	copy(b[unix.NLMSG_HDRLEN:], payload)
	return b
}

// Part is one message of a dump (NLM_F_MULTI, plus extra flags such as
// NLM_F_DUMP_INTR).
func Part(typ uint16, seq uint32, payload []byte, flags uint16) []byte {
	return Msg(typ, unix.NLM_F_MULTI|flags, seq, payload)
}

// Done ends a dump; a non-zero errno is a dump that failed after it
// started, as the kernel reports it.
func Done(seq uint32, errno unix.Errno, flags uint16) []byte {
	return Msg(unix.NLMSG_DONE, unix.NLM_F_MULTI|flags, seq, binary.NativeEndian.AppendUint32(nil, uint32(-int32(errno))))
}

// Ack is an NLMSG_ERROR answer: errno 0 acknowledges. Like the kernel's,
// it carries the request's header after the errno.
func Ack(seq uint32, errno unix.Errno) []byte {
	payload := binary.NativeEndian.AppendUint32(nil, uint32(-int32(errno)))
	return Msg(unix.NLMSG_ERROR, 0, seq, append(payload, make([]byte, unix.NLMSG_HDRLEN)...))
}

// Join packs messages into one datagram.
func Join(msgs ...[]byte) []byte { return slices.Concat(msgs...) }
