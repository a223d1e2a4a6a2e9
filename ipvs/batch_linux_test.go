package ipvs

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
)

// reals returns n real servers 10.244.<i/250>.<i%250+1>:8080, weights 1-3.
func reals(n int) []RealServer {
	out := make([]RealServer, n)
	for i := range out {
		a := netip.AddrFrom4([4]byte{10, 244, byte(i / 250), byte(i%250 + 1)})
		out[i] = RealServer{RealKey: RealKey{Address: a, Port: 8080}, Weight: int32(i%3 + 1)}
	}
	return out
}

func acking(_ int, seq uint32, _ []byte) []any { return []any{nlconntest.Ack(seq, 0)} }

// withoutSeq is a request with its sequence number zeroed: the one
// thing that differs between the same write one by one and batched.
func withoutSeq(req []byte) []byte {
	req = bytes.Clone(req)
	binary.NativeEndian.PutUint32(req[8:], 0)
	return req
}

// Each message of a batch is, byte for byte, the request AddRealServer
// sends for the same real server, IPv4 and IPv6, in the caller's order;
// the batch is one send.
func TestAddRealServersWire(t *testing.T) {
	for _, tc := range []struct {
		vs    ServiceKey
		reals []RealServer
	}{
		{key(TCP, "10.96.0.1:443"), reals(10)},
		{key(UDP, "[fd00::a]:53"), []RealServer{
			{RealKey: rkey("[fd00::5]:53"), Weight: 1}, {RealKey: rkey("[fd00::1]:5353"), Weight: 0},
		}},
	} {
		one, k1 := scriptedHandle(t, acking)
		for _, rs := range tc.reals {
			mustOK(t, one.AddRealServer(tc.vs, rs))
		}
		batched, k2 := scriptedHandle(t, acking)
		if errs := batched.AddRealServers(tc.vs, tc.reals); errs != nil {
			t.Fatal(errs)
		}
		if len(k2.Reqs) != len(k1.Reqs) {
			t.Fatalf("%d messages batched, %d one by one", len(k2.Reqs), len(k1.Reqs))
		}
		for i := range k1.Reqs {
			if a, b := withoutSeq(k1.Reqs[i]), withoutSeq(k2.Reqs[i]); !bytes.Equal(a, b) {
				t.Errorf("%s message %d:\nbatched %x\none     %x\n%s", tc.vs, i, b, a, wireText(t, b))
			}
		}
		if k1.SendCount() != len(tc.reals) || k2.SendCount() != 1 {
			t.Errorf("%d sends one by one, %d batched; want %d and 1", k1.SendCount(), k2.SendCount(), len(tc.reals))
		}
	}
}

// The kernel's refusals come back at their real servers' indexes, as the
// errors AddRealServer returns; the ones after a refusal are written (the
// kernel carries on: nlconn's TestRealSocketPipelined); a real server
// that fails validation is never sent.
func TestAddRealServersErrors(t *testing.T) {
	vs := key(TCP, "10.96.0.1:443")
	rs := reals(6)
	rs[4].Weight = -1 // refused before the kernel
	refuse := map[int]unix.Errno{1: syscall.EEXIST, 3: syscall.ESRCH}
	h, k := scriptedHandle(t, func(n int, seq uint32, _ []byte) []any {
		return []any{nlconntest.Ack(seq, refuse[n])}
	})
	errs := h.AddRealServers(vs, rs)
	if len(errs) != len(rs) {
		t.Fatalf("errors %v, want one per real server", errs)
	}
	// What the one-by-one calls return for the same answers.
	one, _ := scriptedHandle(t, func(_ int, seq uint32, req []byte) []any {
		return []any{nlconntest.Ack(seq, map[string]unix.Errno{"10.244.0.2": syscall.EEXIST, "10.244.0.4": syscall.ESRCH}[destOf(t, req)])}
	})
	for i, r := range rs {
		want := one.AddRealServer(vs, r)
		if fmt.Sprint(errs[i]) != fmt.Sprint(want) || IsExist(errs[i]) != IsExist(want) || IsNotExist(errs[i]) != IsNotExist(want) {
			t.Errorf("real server %d: %v, want %v", i, errs[i], want)
		}
	}
	if !IsExist(errs[1]) || !IsNotExist(errs[3]) || errs[4] == nil || errs[0] != nil || errs[5] != nil {
		t.Errorf("errors %v", errs)
	}
	if len(k.Reqs) != 5 || k.SendCount() != 1 {
		t.Errorf("%d messages in %d sends; want the 5 valid ones in 1", len(k.Reqs), k.SendCount())
	}
}

// destOf is the dest address of a NEW_DEST request.
func destOf(t *testing.T, req []byte) string {
	for top := nlconn.Attrs(req[unix.NLMSG_HDRLEN+4:]); top.Next(); {
		for it := nlconn.Attrs(top.Value); top.Type == attrCmdDest && it.Next(); {
			if it.Type == destAddr {
				addr, _ := netip.AddrFromSlice(it.Value)
				return addr.String()
			}
		}
	}
	t.Fatalf("no dest in %x", req)
	return ""
}

// Round trips per 10 real servers: 10 one by one, 1 batched; system
// calls 20 and 2 (a send, and one recvmmsg for the 10 acknowledgements).
// The benchmark (BenchmarkRealServerWrites) shows the allocations too.
func TestAddRealServersRoundTrips(t *testing.T) {
	vs := key(TCP, "10.96.0.1:443")
	one, k1 := scriptedHandle(t, acking)
	for _, rs := range reals(10) {
		mustOK(t, one.AddRealServer(vs, rs))
	}
	batched, k2 := scriptedHandle(t, acking)
	if errs := batched.AddRealServers(vs, reals(10)); errs != nil {
		t.Fatal(errs)
	}
	if k1.SendCount() != 10 || k2.SendCount() != 1 {
		t.Errorf("round trips per 10 real servers: %d one by one, %d batched; want 10 and 1", k1.SendCount(), k2.SendCount())
	}
	if one, batched := k1.SendCount()+k1.Recvs, k2.SendCount()+k2.Recvs; one != 20 || batched != 2 {
		t.Errorf("system calls per 10 real servers: %d one by one, %d batched; want 20 and 2", one, batched)
	}
}

// BenchmarkRealServerWrites writes 10 real servers per iteration to a
// scripted kernel, one by one and batched: sends/op are the round trips,
// syscalls/op the sends and receives; allocs/op include the scripted
// kernel's own (it copies every request and builds every answer).
func BenchmarkRealServerWrites(b *testing.B) {
	vs := key(TCP, "10.96.0.1:443")
	rs := reals(10)
	for _, mode := range []string{"one-by-one", "batched"} {
		b.Run(mode, func(b *testing.B) {
			h, k := scriptedHandle(b, acking)
			b.ReportAllocs()
			for b.Loop() {
				k.Reqs = k.Reqs[:0] // the kernel's record, not ours: keep it small
				if mode == "batched" {
					if errs := h.AddRealServers(vs, rs); errs != nil {
						b.Fatal(errs)
					}
					continue
				}
				for _, r := range rs {
					if err := h.AddRealServer(vs, r); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(k.SendCount())/float64(b.N), "sends/op")
			b.ReportMetric(float64(k.SendCount()+k.Recvs)/float64(b.N), "syscalls/op")
		})
	}
}

// ackingSocket acknowledges every message sent, each in a datagram of
// its own as the kernel does, without allocating: what is left to count
// is the write path's own allocations.
type ackingSocket struct {
	acks [][nlAckLen]byte // queued, reused
	next int
}

const nlAckLen = unix.NLMSG_HDRLEN + 4 + unix.NLMSG_HDRLEN

func (s *ackingSocket) Send(b []byte) error {
	s.acks, s.next = s.acks[:0], 0
	for off := 0; off < len(b); {
		l := int(binary.NativeEndian.Uint32(b[off:]))
		var a [nlAckLen]byte
		binary.NativeEndian.PutUint32(a[:], nlAckLen)
		binary.NativeEndian.PutUint16(a[4:], unix.NLMSG_ERROR)
		copy(a[8:12], b[off+8:off+12]) // the sequence number
		copy(a[20:], b[off:off+unix.NLMSG_HDRLEN])
		s.acks = append(s.acks, a)
		off += (l + 3) &^ 3
	}
	return nil
}

func (s *ackingSocket) Recv(b []byte) (int, error) {
	if s.next == len(s.acks) {
		return 0, unix.EAGAIN
	}
	s.next++
	return copy(b, s.acks[s.next-1][:]), nil
}

func (s *ackingSocket) RecvMulti(buf []byte, slot int, lens []int) (int, error) {
	n := 0
	for ; n < len(lens) && s.next < len(s.acks); n++ {
		lens[n] = copy(buf[n*slot:], s.acks[s.next][:])
		s.next++
	}
	if n == 0 {
		return 0, unix.EAGAIN
	}
	return n, nil
}

func (s *ackingSocket) Close() error { return nil }

// No allocation per real server: a batch of 250 costs the allocations a
// batch of 10 does, none once the buffers (the Handle's and the Conn's)
// are made.
func TestAddRealServersAllocationsDoNotGrow(t *testing.T) {
	sock := &ackingSocket{acks: make([][nlAckLen]byte, 0, nlconn.MaxPipelined)}
	conn := nlconn.NewConn(nlconn.Config{}, func() (nlconn.Socket, error) { return sock, nil })
	h := &Handle{family: testFamily, writes: conn, dumps: conn}
	vs := key(TCP, "10.96.0.1:443")
	allocs := map[int]float64{}
	for _, n := range []int{10, 250} {
		rs := reals(n)
		allocs[n] = testing.AllocsPerRun(50, func() {
			if errs := h.AddRealServers(vs, rs); errs != nil {
				t.Fatal(errs)
			}
		})
	}
	if allocs[250] != allocs[10] || allocs[10] > 2 {
		t.Errorf("allocations per batch: %v for 10 real servers, %v for 250; want the same, next to none", allocs[10], allocs[250])
	}
	t.Logf("allocations per batch: %v", allocs)
}

// serviceAdds returns n services 10.96.<i/250>.<i%250+1>:80/tcp with
// perService real servers each.
func serviceAdds(n, perService int) []ServiceAdd {
	out := make([]ServiceAdd, n)
	for i := range out {
		a := netip.AddrFrom4([4]byte{10, 96, byte(i / 250), byte(i%250 + 1)})
		out[i] = ServiceAdd{VS: VirtualServer{ServiceKey: ServiceKey{Address: a, Protocol: TCP, Port: 80}, Scheduler: "rr"},
			Reals: reals(perService)}
	}
	return out
}

// AddServices sends, byte for byte, the requests AddVirtualServer and
// AddRealServer send for the same objects, in order (each virtual server
// before its real servers), in one send for up to nlconn.MaxPipelined
// messages (fewer when their acknowledgements would not fit the receive
// buffer: a scripted socket's is the kernel's default, room for 145): 20
// services of 5 real servers are 120 messages, one round trip instead of
// 120 (or 40 with AddRealServers per service); an Existing add sends its
// real servers alone: 114 messages here (20 services, 96 real servers).
func TestAddServicesWire(t *testing.T) {
	adds := serviceAdds(20, 5)
	adds[7].VS = VirtualServer{ServiceKey: key(UDP, "[fd00::a]:53"), Scheduler: "mh", Flags: FlagSchedFlag1, Timeout: 0}
	adds[7].Reals = []RealServer{{RealKey: rkey("[fd00::5]:53"), Weight: 1}}
	adds[3].Existing, adds[12].Existing = true, true // their real servers only
	one, k1 := scriptedHandle(t, acking)
	for _, a := range adds {
		if !a.Existing {
			mustOK(t, one.AddVirtualServer(a.VS))
		}
		for _, rs := range a.Reals {
			mustOK(t, one.AddRealServer(a.VS.ServiceKey, rs))
		}
	}
	batched, k2 := scriptedHandle(t, acking)
	if errs := batched.AddServices(adds); errs != nil {
		t.Fatal(errs)
	}
	if len(k2.Reqs) != len(k1.Reqs) {
		t.Fatalf("%d messages batched, %d one by one", len(k2.Reqs), len(k1.Reqs))
	}
	for i := range k1.Reqs {
		if a, b := withoutSeq(k1.Reqs[i]), withoutSeq(k2.Reqs[i]); !bytes.Equal(a, b) {
			t.Errorf("message %d:\nbatched %x\none     %x\n%s", i, b, a, wireText(t, b))
		}
	}
	if len(k2.Reqs) != 114 || k2.SendCount() != 1 {
		t.Errorf("%d messages in %d sends, want 1", len(k2.Reqs), k2.SendCount())
	}
}

// The kernel's refusals come back at their adds and real servers, as the
// errors the single calls return: a virtual server that exists
// (IsExist), a scheduler that is not loaded (MissingScheduler), its real
// servers refused after it (IsNotExist); a virtual server that fails
// validation sends nothing, its real servers get no error; the rest is
// written.
func TestAddServicesErrors(t *testing.T) {
	adds := serviceAdds(4, 2)
	adds[1].VS.Scheduler = "twos"
	adds[2].VS.Scheduler = "" // refused before the kernel
	refuse := map[int]unix.Errno{0: syscall.EEXIST, 3: syscall.ENOENT, 4: syscall.ESRCH, 5: syscall.ESRCH}
	h, k := scriptedHandle(t, func(n int, seq uint32, _ []byte) []any {
		return []any{nlconntest.Ack(seq, refuse[n])}
	})
	errs := h.AddServices(adds)
	if len(errs) != len(adds) {
		t.Fatalf("errors %v, want one per add", errs)
	}
	if !IsExist(errs[0].VS) || errs[0].Reals != nil {
		t.Errorf("existing virtual server: %+v", errs[0])
	}
	if name, ok := MissingScheduler(errs[1].VS); !ok || name != "twos" || !IsNotExist(errs[1].Reals[0]) || !IsNotExist(errs[1].Reals[1]) {
		t.Errorf("missing scheduler: %+v", errs[1])
	}
	if errs[2].VS == nil || errs[2].Reals != nil {
		t.Errorf("invalid virtual server: %+v", errs[2])
	}
	if errs[3].VS != nil || errs[3].Reals != nil {
		t.Errorf("written: %+v", errs[3])
	}
	if want := one(t, adds[1].VS); fmt.Sprint(errs[1].VS) != want {
		t.Errorf("missing scheduler: %v, want the error AddVirtualServer returns: %s", errs[1].VS, want)
	}
	if len(k.Reqs) != 9 || k.SendCount() != 1 {
		t.Errorf("%d messages in %d sends; want the 9 of the valid adds in 1", len(k.Reqs), k.SendCount())
	}
}

// one is AddVirtualServer's error for vs refused with ENOENT.
func one(t *testing.T, vs VirtualServer) string {
	h, _ := scriptedHandle(t, func(_ int, seq uint32, _ []byte) []any { return []any{nlconntest.Ack(seq, syscall.ENOENT)} })
	return fmt.Sprint(h.AddVirtualServer(vs))
}
