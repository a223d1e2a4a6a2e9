package nlconn

// Pipelined writes: many requests in one sendto, their acknowledgements
// read after.
//
// What the kernel does with such a datagram (net/netlink/af_netlink.c,
// netlink_rcv_skb, which generic netlink and rtnetlink both use as their
// input): it walks the datagram message by message, calls the family's
// handler for each and, when the message asked for it (NLM_F_ACK) or the
// handler failed, queues one NLMSG_ERROR for it, with the message's
// sequence number; then it moves to the next message whatever the
// outcome. A refused message therefore does not stop the ones after it:
// each gets its own answer, in order. The only exceptions are a handler
// returning -EINTR (the start of a dump: no acknowledgement; not a write)
// and a truncated message, which ends the walk silently. This all
// happens inside the sendto, in the sender's context, so when sendto
// returns every acknowledgement is queued on our socket already.
//
// Which is why the batch is bounded by our receive buffer: the kernel
// queues each acknowledgement as its own datagram (an skb charged at its
// truesize: some 1.2–1.5 KiB for an error echoing a 300-byte request,
// by TestRealSocketPipelinedSmallBuffer) with MSG_DONTWAIT, and when
// the buffer is full it drops it and flags the socket. The next receive
// then fails with ENOBUFS even before what is still queued, so every
// message not yet answered is reported lost (ErrAckLost) and the socket
// replaced. An error acknowledgement carries the whole request back
// (NETLINK_CAP_ACK, which would cap it, is not set: ipset's batched adds
// read the echo). A batch's acknowledgements must all fit at once, since
// nothing reads them before the send returns.

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

const (
	// maxPipelineBytes bounds one send's datagram: the kernel copies it
	// into one skb, and 64 KiB stays within what the default send buffer
	// (net.core.wmem_default, 208 KiB) takes without blocking.
	maxPipelineBytes = 64 << 10
	// assumedRcvBuf is the receive buffer of a socket that cannot say its
	// own (a scripted one): the kernel's default, net.core.rmem_default.
	assumedRcvBuf = 212992
)

// ackCost is what one acknowledgement of a request of reqLen bytes may
// take of the receive buffer: the skb's truesize (struct sk_buff, the
// shared info, the head rounded up by the slab allocator) plus the
// echoed request of an error. Overestimated on purpose, and nextBatch
// keeps a quarter of the buffer spare on top: a batch cut too short
// costs a system call, one cut too long loses acknowledgements (512
// bytes instead of 1024 here does, on a 16 KiB buffer).
func ackCost(reqLen int) int { return 1024 + nlmsgAlign(reqLen) }

// Acked is told the outcome of message i of a pipelined batch: nil when
// the kernel acknowledged it, the kernel's errno (a unix.Errno) when it
// refused it, else an error wrapping ErrAckLost, or the send's error.
// For a refusal, echo is the error acknowledgement's payload after the
// errno, as ErrorReport gets it; it is only valid during the call.
type Acked func(i int, err error, echo []byte)

// rcvBufSizer is a Socket that knows its receive buffer.
type rcvBufSizer interface{ RcvBufSize() int }

// ExecutePipelined sends the write requests packed back to back in msgs,
// each a whole netlink message with NLM_F_ACK set and padded to 4 bytes
// (what nl.NetlinkRequest.Serialize makes, appended), as few sends as
// the bounds allow (MaxPipelined messages, 64 KiB, the acknowledgements
// within the socket's receive buffer), and tells acked the outcome of
// every message, in order. It writes the sequence numbers into msgs.
// A message refused does not keep the kernel from applying the ones
// after it (see the top of this file). It fails, sending nothing, only
// when msgs is not a run of netlink messages. acked runs with the Conn
// held and must not use it.
func (c *Conn) ExecutePipelined(msgs []byte, acked Acked) error {
	if err := checkMessages(msgs); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := &c.main
	for i := 0; len(msgs) > 0; {
		if s.sock == nil {
			sock, err := c.dial()
			if err != nil {
				n := countMessages(msgs)
				for j := range n {
					acked(i+j, err, nil)
				}
				return nil
			}
			s.sock = sock
		}
		chunk, n := nextBatch(msgs, rcvBufOf(s.sock))
		c.sendBatch(s, chunk, n, func(j int, err error, echo []byte) { acked(i+j, err, echo) })
		msgs, i = msgs[len(chunk):], i+n
	}
	return nil
}

// checkMessages verifies msgs is a run of whole netlink messages.
func checkMessages(msgs []byte) error {
	native := nl.NativeEndian()
	for off := 0; off < len(msgs); {
		if len(msgs)-off < unix.NLMSG_HDRLEN {
			return fmt.Errorf("netlink pipeline: %d stray bytes after the last message", len(msgs)-off)
		}
		l := int(native.Uint32(msgs[off:]))
		if l < unix.NLMSG_HDRLEN || off+l > len(msgs) {
			return fmt.Errorf("netlink pipeline: malformed message at byte %d (length %d)", off, l)
		}
		off += min(nlmsgAlign(l), len(msgs)-off)
	}
	return nil
}

func countMessages(msgs []byte) int {
	n := 0
	for off := 0; off < len(msgs); n++ {
		off += nlmsgAlign(int(nl.NativeEndian().Uint32(msgs[off:])))
	}
	return n
}

func rcvBufOf(sock Socket) int {
	if s, ok := sock.(rcvBufSizer); ok && s.RcvBufSize() > 0 {
		return s.RcvBufSize()
	}
	return assumedRcvBuf
}

// nextBatch is the first messages of msgs one send may carry: at most
// MaxPipelined, maxPipelineBytes, and acknowledgements for three
// quarters of rcvBuf (the rest is margin for the estimate). At least one
// message, whatever its size.
func nextBatch(msgs []byte, rcvBuf int) ([]byte, int) {
	native := nl.NativeEndian()
	budget := rcvBuf * 3 / 4
	off, n := 0, 0
	for off < len(msgs) && n < MaxPipelined {
		l := nlmsgAlign(int(native.Uint32(msgs[off:])))
		end := min(off+l, len(msgs))
		budget -= ackCost(l)
		if n > 0 && (end > maxPipelineBytes || budget < 0) {
			break
		}
		off, n = end, n+1
	}
	return msgs[:off], n
}

// sendBatch numbers the n messages of chunk with consecutive sequence
// numbers, sends them in one datagram and reads their acknowledgements.
func (c *Conn) sendBatch(s *session, chunk []byte, n int, acked Acked) {
	native := nl.NativeEndian()
	first := c.seq.Add(uint32(n)) - uint32(n) + 1
	for off, seq := 0, first; off < len(chunk); seq++ {
		native.PutUint32(chunk[off+8:], seq)
		off += min(nlmsgAlign(int(native.Uint32(chunk[off:]))), len(chunk)-off)
	}
	err := s.sock.Send(chunk)
	for errors.Is(err, unix.EINTR) {
		err = s.sock.Send(chunk)
	}
	if err != nil {
		// sendto queues a netlink datagram whole or not at all.
		_ = s.drop()
		for j := range n {
			acked(j, fmt.Errorf("netlink send: %w", err), nil)
		}
		return
	}
	p := pipeline{first: first, n: uint32(n), acked: acked}
	slot := ackSlot(chunk)
	for p.next < p.n {
		if err := c.receiveAcks(s, &p, slot); err != nil {
			_ = s.drop()
			p.lose(p.n, err)
			return
		}
	}
}

// multiReceiver is a Socket that reads several datagrams per system call
// (recvmmsg).
type multiReceiver interface {
	RecvMulti(buf []byte, slot int, lens []int) (int, error)
}

// ackSlot is the room a multi-datagram receive gives each datagram:
// enough for any acknowledgement of chunk's messages (the header, the
// errno and the longest request echoed whole), and at least minAckSlot,
// so that something else queued (a stale reply of several messages)
// rarely gets cut. A datagram cut is reported, never misread.
func ackSlot(chunk []byte) int {
	longest := 0
	for off := 0; off < len(chunk); {
		l := nlmsgAlign(int(nl.NativeEndian().Uint32(chunk[off:])))
		longest, off = max(longest, l), off+l
	}
	return max(nlmsgAlign(unix.NLMSG_HDRLEN+4+longest), minAckSlot)
}

// minAckSlot: 64 acknowledgements per receive in nlconn's 64 KiB buffer,
// so a full batch of MaxPipelined costs 4 receives instead of 256.
const minAckSlot = 1 << 10

// receiveAcks reads what is queued for p: as many acknowledgements as
// fit the session's buffer in one system call when the socket can, else
// one datagram.
func (c *Conn) receiveAcks(s *session, p *pipeline, slot int) error {
	mr, ok := s.sock.(multiReceiver)
	if !ok || slot > len(s.buf) {
		m, err := retryEINTR(func() (int, error) { return s.sock.Recv(s.buf) })
		if err != nil {
			return c.receiveError(err)
		}
		return p.datagram(s.buf[:m])
	}
	if s.lens == nil {
		s.lens = make([]int, MaxPipelined)
	}
	lens := s.lens[:min(int(p.n-p.next), len(s.buf)/slot, len(s.lens))]
	got, err := retryEINTR(func() (int, error) { return mr.RecvMulti(s.buf, slot, lens) })
	if err != nil {
		return c.receiveError(err)
	}
	for i, l := range lens[:got] {
		if l > slot {
			return fmt.Errorf("a %d-byte reply does not fit its %d-byte slot", l, slot)
		}
		if err := p.datagram(s.buf[i*slot : i*slot+l]); err != nil {
			return err
		}
	}
	return nil
}

// retryEINTR repeats a receive a signal interrupted: with a socket
// timeout set, the kernel does not restart it itself, and the Go
// runtime signals its threads often (preemption).
func retryEINTR(recv func() (int, error)) (int, error) {
	n, err := recv()
	for errors.Is(err, unix.EINTR) {
		n, err = recv()
	}
	return n, err
}

func (c *Conn) receiveError(err error) error {
	if errors.Is(err, unix.EAGAIN) {
		return fmt.Errorf("%w (%v)", ErrTimeout, c.cfg.Timeout)
	}
	return err
}

// pipeline follows the acknowledgements of one batch: messages first to
// first+n-1 by sequence number, answered in order.
type pipeline struct {
	first, n uint32
	next     uint32 // acknowledgements handed over so far
	acked    Acked
}

// datagram hands over the acknowledgements in b; an error when b is
// malformed. Messages of other requests (stale replies) are skipped.
func (p *pipeline) datagram(b []byte) error {
	native := nl.NativeEndian()
	for len(b) >= unix.NLMSG_HDRLEN {
		l := int(native.Uint32(b))
		if l < unix.NLMSG_HDRLEN || l > len(b) {
			return fmt.Errorf("malformed message (length %d of %d bytes)", l, len(b))
		}
		typ, seq := native.Uint16(b[4:]), native.Uint32(b[8:])
		data := b[unix.NLMSG_HDRLEN:l]
		b = b[min(nlmsgAlign(l), len(b)):]
		j := seq - p.first // wraps to a huge number below first
		if typ != unix.NLMSG_ERROR || j >= p.n || j < p.next {
			continue
		}
		// The kernel answers in order: an acknowledgement past the next
		// one expected means those between were dropped.
		if j > p.next {
			p.lose(j, errAckSkipped)
		}
		if len(data) < 4 {
			p.lose(j+1, errShortAck)
			continue
		}
		if errno := errnoOf(data); errno != 0 {
			p.acked(int(j), errno, data[4:])
		} else {
			p.acked(int(j), nil, nil)
		}
		p.next = j + 1
	}
	return nil
}

var (
	errAckSkipped = errors.New("acknowledgement skipped")
	errShortAck   = errors.New("short error message")
)

// lose reports the messages from next up to (not including) end as
// unacknowledged, because of why.
func (p *pipeline) lose(end uint32, why error) {
	for ; p.next < end; p.next++ {
		p.acked(int(p.next), fmt.Errorf("netlink receive: %w: %w", ErrAckLost, why), nil)
	}
}
