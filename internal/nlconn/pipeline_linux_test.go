package nlconn_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
)

// batch packs n acknowledged requests of type typData, each carrying
// its index as payload, back to back.
func batch(n int) []byte {
	var b []byte
	for i := range n {
		req := nl.NewNetlinkRequest(typData, unix.NLM_F_ACK)
		req.AddRawData(binary.NativeEndian.AppendUint32(nil, uint32(i)))
		b = append(b, req.Serialize()...)
	}
	return b
}

// outcomes collects what a pipelined batch reported, by index.
type outcomes struct {
	errs  []error
	echos map[int][]byte
	order []int
}

func (o *outcomes) acked(i int, err error, echo []byte) {
	for len(o.errs) <= i {
		o.errs = append(o.errs, errors.New("never reported"))
	}
	o.errs[i], o.order = err, append(o.order, i)
	if echo != nil {
		if o.echos == nil {
			o.echos = map[int][]byte{}
		}
		o.echos[i] = append([]byte(nil), echo...)
	}
}

// reported checks every message was reported once, in order.
func (o *outcomes) reported(t *testing.T, n int) {
	t.Helper()
	if len(o.order) != n {
		t.Fatalf("%d outcomes reported, want %d", len(o.order), n)
	}
	for i, j := range o.order {
		if i != j {
			t.Fatalf("outcomes reported in the order %v", o.order)
		}
	}
}

// connMaker opens a Conn on a scripted kernel.
type connMaker func(nlconntest.Answer) (*nlconn.Conn, *nlconntest.Kernel)

// inBothModes runs test with sockets that read many datagrams per
// receive (recvmmsg, as the real ones) and with sockets that read one.
func inBothModes(t *testing.T, test func(t *testing.T, newConn connMaker, multi bool)) {
	for _, multi := range []bool{true, false} {
		t.Run(map[bool]string{true: "recvmmsg", false: "recv"}[multi], func(t *testing.T) {
			test(t, func(answer nlconntest.Answer) (*nlconn.Conn, *nlconntest.Kernel) {
				c, k := nlconntest.New(t, answer)
				k.NoRecvMulti = !multi
				return c, k
			}, multi)
		})
	}
}

func acking(_ int, seq uint32, _ []byte) []any { return []any{ack(seq, 0)} }

// Ten requests go in one send; each gets its own acknowledgement, by
// its own sequence number, all read in one receive where recvmmsg is.
func TestPipelinedOneSend(t *testing.T) {
	inBothModes(t, testPipelinedOneSend)
}

func testPipelinedOneSend(t *testing.T, newConn connMaker, multi bool) {
	c, k := newConn(acking)
	var o outcomes
	if err := c.ExecutePipelined(batch(10), o.acked); err != nil {
		t.Fatal(err)
	}
	o.reported(t, 10)
	for i, err := range o.errs {
		if err != nil {
			t.Errorf("message %d: %v", i, err)
		}
	}
	seqs := map[uint32]bool{}
	for _, req := range k.Reqs {
		seqs[binary.NativeEndian.Uint32(req[8:])] = true
	}
	if k.SendCount() != 1 || len(k.Reqs) != 10 || len(seqs) != 10 {
		t.Errorf("%d sends of %d messages with %d sequence numbers; want 1 of 10 with 10", k.SendCount(), len(k.Reqs), len(seqs))
	}
	if want := map[bool]int{true: 1, false: 10}[multi]; k.Recvs != want {
		t.Errorf("%d receives, want %d", k.Recvs, want)
	}
}

// A message the kernel refuses gets its errno and echo; the kernel goes
// on with the next ones (netlink_rcv_skb), so do we. The answers may
// come several to a datagram.
func TestPipelinedFailureInTheMiddle(t *testing.T) {
	inBothModes(t, testPipelinedFailureInTheMiddle)
}

func testPipelinedFailureInTheMiddle(t *testing.T, newConn connMaker, _ bool) {
	echo := []byte("the request, echoed")
	c, _ := newConn(func(n int, seq uint32, _ []byte) []any {
		if n == 4 {
			errno := -int32(unix.EEXIST)
			payload := binary.NativeEndian.AppendUint32(nil, uint32(errno))
			return []any{nlconntest.Msg(unix.NLMSG_ERROR, 0, seq, append(payload, echo...))}
		}
		return []any{ack(seq, 0)}
	})
	var o outcomes
	if err := c.ExecutePipelined(batch(8), o.acked); err != nil {
		t.Fatal(err)
	}
	o.reported(t, 8)
	for i, err := range o.errs {
		if want := error(nil); i == 4 && err != unix.EEXIST || i != 4 && err != want {
			t.Errorf("message %d: %v", i, err)
		}
	}
	if len(o.echos) != 1 || !strings.HasPrefix(string(o.echos[4]), string(echo)) {
		t.Errorf("echos %v, want message 4's", o.echos)
	}
}

// A batch larger than MaxPipelined, or than the receive buffer can hold
// acknowledgements for, goes in several sends; every message is still
// answered, in order.
func TestPipelinedBound(t *testing.T) {
	for _, tc := range []struct {
		n, rcvBuf, sends int
	}{
		{nlconn.MaxPipelined, 0, 1},
		{nlconn.MaxPipelined + 1, 0, 2},
		{600, 0, 3},
		{20, 8 << 10, 4}, // 6 KiB for acknowledgements of ~1 KiB each: 5 per send
	} {
		t.Run(fmt.Sprint(tc.n, "/", tc.rcvBuf), func(t *testing.T) {
			c, k := nlconntest.New(t, acking)
			k.RcvBuf = tc.rcvBuf
			if tc.rcvBuf == 0 {
				k.RcvBuf = 4 << 20 // SO_RCVBUFFORCE'd: only MaxPipelined binds
			}
			var o outcomes
			if err := c.ExecutePipelined(batch(tc.n), o.acked); err != nil {
				t.Fatal(err)
			}
			o.reported(t, tc.n)
			if k.SendCount() != tc.sends {
				t.Errorf("%d sends, want %d", k.SendCount(), tc.sends)
			}
			for i, err := range o.errs {
				if err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
			}
		})
	}
}

// Lost acknowledgements (the receive buffer overflowed: ENOBUFS) or none
// in time: those not yet answered are reported lost, with why; the
// socket is replaced for the next batch.
func TestPipelinedLostAcks(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lost  []any
		cause error
	}{
		{"ENOBUFS", []any{unix.ENOBUFS}, unix.ENOBUFS},
		{"timeout", nil, nlconn.ErrTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inBothModes(t, func(t *testing.T, newConn connMaker, _ bool) {
				c, k := newConn(func(n int, seq uint32, _ []byte) []any {
					switch {
					case n == 2:
						return tc.lost
					case n > 2 && n < 5:
						return nil // dropped after the overflow
					}
					return []any{ack(seq, 0)}
				})
				var o outcomes
				if err := c.ExecutePipelined(batch(5), o.acked); err != nil {
					t.Fatal(err)
				}
				o.reported(t, 5)
				for i, err := range o.errs {
					lost := errors.Is(err, nlconn.ErrAckLost) && errors.Is(err, tc.cause)
					if i < 2 && err != nil || i >= 2 && !lost {
						t.Errorf("message %d: %v", i, err)
					}
				}
				o = outcomes{}
				if err := c.ExecutePipelined(batch(2), o.acked); err != nil || o.errs[0] != nil || o.errs[1] != nil {
					t.Errorf("the next batch: %v, %v", err, o.errs)
				}
				if _, dials, closes := k.Counts(); dials != 2 || closes != 1 {
					t.Errorf("%d dials, %d closes; want the socket replaced", dials, closes)
				}
			})
		})
	}
}

// Stale answers (another request's sequence number) are skipped; an
// acknowledgement that skips one reports the skipped one lost.
func TestPipelinedStaleAndSkipped(t *testing.T) {
	inBothModes(t, testPipelinedStaleAndSkipped)
}

func testPipelinedStaleAndSkipped(t *testing.T, newConn connMaker, _ bool) {
	c, _ := newConn(func(n int, seq uint32, _ []byte) []any {
		switch n {
		case 0:
			return []any{join(ack(seq-100, unix.EPERM), ack(seq, 0))}
		case 1:
			return nil // its acknowledgement never comes...
		}
		return []any{ack(seq, 0)} // ...but the next one's does
	})
	var o outcomes
	if err := c.ExecutePipelined(batch(3), o.acked); err != nil {
		t.Fatal(err)
	}
	o.reported(t, 3)
	if o.errs[0] != nil || !errors.Is(o.errs[1], nlconn.ErrAckLost) || o.errs[2] != nil {
		t.Errorf("outcomes %v; want nil, lost, nil", o.errs)
	}
}

// A datagram too long for its slot of a multi-datagram receive (here a
// stale reply of 2 KiB) is cut: the messages not yet answered are
// reported lost, not misread, and the socket replaced.
func TestPipelinedCutDatagram(t *testing.T) {
	c, k := nlconntest.New(t, func(n int, seq uint32, _ []byte) []any {
		if n == 1 {
			return []any{nlconntest.Msg(typData, 0, seq-100, make([]byte, 2048)), ack(seq, 0)}
		}
		return []any{ack(seq, 0)}
	})
	var o outcomes
	if err := c.ExecutePipelined(batch(3), o.acked); err != nil {
		t.Fatal(err)
	}
	o.reported(t, 3)
	if o.errs[0] != nil || !errors.Is(o.errs[1], nlconn.ErrAckLost) || !strings.Contains(o.errs[1].Error(), "does not fit") {
		t.Errorf("outcomes %v; want nil, then lost: cut", o.errs)
	}
	if _, _, closes := k.Counts(); closes != 1 {
		t.Errorf("%d closes, want the socket replaced", closes)
	}
}

// A buffer that is not a run of messages is refused before anything is
// sent.
func TestPipelinedMalformed(t *testing.T) {
	c, k := nlconntest.New(t, acking)
	b := batch(3)
	binary.NativeEndian.PutUint32(b[len(b)/3:], 4096)
	var o outcomes
	if err := c.ExecutePipelined(b, o.acked); err == nil || len(o.order) != 0 || k.SendCount() != 0 {
		t.Errorf("malformed batch: %v, %d outcomes, %d sends", err, len(o.order), k.SendCount())
	}
	if err := c.ExecutePipelined(append(batch(1), 1, 2), o.acked); err == nil {
		t.Error("stray bytes after the last message were accepted")
	}
}

// The real kernel (rtnetlink, no privilege needed): a request it refuses
// in the middle of a batch (a message type past RTM_MAX: EOPNOTSUPP)
// does not keep it from answering the ones after it; 200 answers read
// with recvmmsg arrive whole and in order.
func TestRealSocketPipelined(t *testing.T) {
	c, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_ROUTE})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const n, bad = 200, 77
	var b []byte
	for i := range n {
		typ := unix.NLMSG_NOOP // acknowledged without a handler
		if i == bad {
			typ = 0x3fff // no such rtnetlink message type
		}
		b = append(b, nl.NewNetlinkRequest(typ, unix.NLM_F_ACK).Serialize()...)
	}
	var o outcomes
	if err := c.ExecutePipelined(b, o.acked); err != nil {
		t.Fatal(err)
	}
	o.reported(t, n)
	for i, err := range o.errs {
		if i == bad && err != unix.EOPNOTSUPP || i != bad && err != nil {
			t.Errorf("message %d: %v", i, err)
		}
	}
	if len(o.echos[bad]) < unix.NLMSG_HDRLEN {
		t.Errorf("the refusal's echo: %x; want the request's header at least", o.echos[bad])
	}
}

// The real kernel again, with a receive buffer far too small for the
// batch's acknowledgements (16 KiB): the batch is cut so that each
// send's acknowledgements fit (ackCost holds against the kernel's own
// accounting), and none is lost. Each is an error echoing a 300-byte
// request, the largest acknowledgements a write gets.
func TestRealSocketPipelinedSmallBuffer(t *testing.T) {
	c, err := nlconn.Dial(nlconn.Config{Protocol: unix.NETLINK_ROUTE, RcvBuf: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rcvBuf, err := c.RcvBuf()
	if err != nil || rcvBuf > 64<<10 {
		t.Fatalf("SO_RCVBUF %d, %v; want a small one", rcvBuf, err)
	}
	const n = 300
	var b []byte
	for range n {
		req := nl.NewNetlinkRequest(0x3fff, unix.NLM_F_ACK) // refused: EOPNOTSUPP, echoed
		req.AddRawData(make([]byte, 300))
		b = append(b, req.Serialize()...)
	}
	var o outcomes
	if err := c.ExecutePipelined(b, o.acked); err != nil {
		t.Fatal(err)
	}
	o.reported(t, n)
	for i, err := range o.errs {
		if err != unix.EOPNOTSUPP {
			t.Fatalf("message %d of %d with SO_RCVBUF %d: %v", i, n, rcvBuf, err)
		}
	}
}
