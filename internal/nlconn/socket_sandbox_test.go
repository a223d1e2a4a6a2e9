//go:build sandbox

package nlconn

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
)

// As root (CAP_NET_ADMIN), the dump socket gets its 8 MiB receive buffer
// even though net.core.rmem_max is the kernel's small default: the
// kernel reports twice what was set, for its bookkeeping.
func TestSandboxRcvBufForced(t *testing.T) {
	sandboxtest.RequireRoot(t)
	raw, err := os.ReadFile("/proc/sys/net/core/rmem_max")
	if err != nil {
		t.Fatal(err)
	}
	rmemMax, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
	if rmemMax >= DefaultRcvBuf {
		t.Fatalf("rmem_max is %d: this test needs it below %d to prove anything", rmemMax, DefaultRcvBuf)
	}
	c, err := Dial(Config{Protocol: unix.NETLINK_ROUTE, RcvBuf: DefaultRcvBuf})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := c.RcvBuf()
	if err != nil || got != 2*DefaultRcvBuf {
		t.Errorf("SO_RCVBUF = %d, %v; want %d with rmem_max %d", got, err, 2*DefaultRcvBuf, rmemMax)
	}
}

// countingSocket counts a real socket's system calls.
type countingSocket struct {
	*fdSocket
	sends, recvs int
}

func (s *countingSocket) Send(b []byte) error { s.sends++; return s.fdSocket.Send(b) }

func (s *countingSocket) Recv(b []byte) (int, error) { s.recvs++; return s.fdSocket.Recv(b) }

func (s *countingSocket) RecvMulti(buf []byte, slot int, lens []int) (int, error) {
	s.recvs++
	return s.fdSocket.RecvMulti(buf, slot, lens)
}

// With the receive buffer the IPVS writes socket asks for (512 KiB,
// forced past rmem_max as root), a full batch of MaxPipelined writes
// goes in one send, and its acknowledgements (errors echoing each
// request: the largest) all arrive, read in a few recvmmsg calls.
func TestSandboxPipelinedFullBatch(t *testing.T) {
	sandboxtest.RequireRoot(t)
	cfg := Config{Protocol: unix.NETLINK_ROUTE, RcvBuf: 512 << 10, Timeout: DefaultTimeout}
	var sock *countingSocket
	c := NewConn(cfg, func() (Socket, error) {
		s, err := dialFD(cfg)
		if err != nil {
			return nil, err
		}
		sock = &countingSocket{fdSocket: s.(*fdSocket)}
		return sock, nil
	})
	defer c.Close()
	var b []byte
	for range MaxPipelined {
		req := nl.NewNetlinkRequest(0x3fff, unix.NLM_F_ACK) // refused: EOPNOTSUPP, echoed
		req.AddRawData(make([]byte, 100))                   // about an IPVS destination's size
		b = append(b, req.Serialize()...)
	}
	refused := 0
	err := c.ExecutePipelined(b, func(i int, err error, _ []byte) {
		if err != unix.EOPNOTSUPP {
			t.Errorf("message %d: %v", i, err)
			return
		}
		refused++
	})
	if err != nil || refused != MaxPipelined {
		t.Fatalf("%v; %d of %d answered", err, refused, MaxPipelined)
	}
	if sock.sends != 1 || sock.recvs > MaxPipelined/64 {
		t.Errorf("%d sends and %d receives for %d writes; want 1 and at most %d", sock.sends, sock.recvs, MaxPipelined, MaxPipelined/64)
	}
	t.Logf("%d writes: %d send, %d receives (SO_RCVBUF %d)", MaxPipelined, sock.sends, sock.recvs, sock.rcvBuf)
}
