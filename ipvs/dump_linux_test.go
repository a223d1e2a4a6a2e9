package ipvs

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"slices"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
)

// The dump parsers and walkers, fed messages built the way the kernel's
// ip_vs_genl_fill_service/_dest build them (include/uapi/linux/ip_vs.h),
// through nlconn's real receive loop and a scripted kernel. The sandbox
// tests check the same code against the real kernel.

const testFamily = 0x1c // the IPVS generic netlink family id, as resolved

func u16(v uint16) []byte { return binary.NativeEndian.AppendUint16(nil, v) }
func u32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }
func u64(v uint64) []byte { return binary.NativeEndian.AppendUint64(nil, v) }

// genlMsg is a generic netlink payload: header (IPVS_CMD_NEW_SERVICE or
// _NEW_DEST, as the kernel answers a GET) and one nested attribute.
func genlMsg(cmd uint8, attr *nl.RtAttr) []byte {
	return append((&nl.Genlmsg{Command: cmd, Version: genlVersion}).Serialize(), attr.Serialize()...)
}

// addr16 is a union nf_inet_addr: IPv4 in the first 4 of 16 bytes.
func addr16(a netip.Addr) []byte {
	b := make([]byte, 16)
	copy(b, a.AsSlice())
	return b
}

type wireService struct {
	vs      VirtualServer
	fwmark  uint32
	stats32 Stats // sent in IPVS_SVC_ATTR_STATS; vs.Stats in STATS64
	addr    []byte
}

func (w wireService) msg() []byte {
	a := nl.NewRtAttr(attrCmdService|int(nl.NLA_F_NESTED), nil)
	a.AddRtAttr(svcAF, u16(family(w.vs.Address)))
	if w.fwmark != 0 {
		a.AddRtAttr(svcFWMark, u32(w.fwmark))
	} else {
		a.AddRtAttr(svcProtocol, u16(uint16(w.vs.Protocol)))
		addr := w.addr
		if addr == nil {
			addr = addr16(w.vs.Address)
		}
		a.AddRtAttr(svcAddr, addr)
		a.AddRtAttr(svcPort, binary.BigEndian.AppendUint16(nil, w.vs.Port))
	}
	a.AddRtAttr(svcSchedName, nl.ZeroTerminated(w.vs.Scheduler))
	a.AddRtAttr(svcFlags, append(u32(uint32(w.vs.Flags)), u32(0xffffffff)...))
	a.AddRtAttr(svcTimeout, u32(w.vs.Timeout))
	a.AddRtAttr(svcNetmask, u32(0xffffffff))
	st := nl.NewRtAttr(svcStats|int(nl.NLA_F_NESTED), nil)
	st.AddRtAttr(statsConns, u32(uint32(w.stats32.Connections)))
	st.AddRtAttr(statsInPkts, u32(uint32(w.stats32.PacketsIn)))
	st.AddRtAttr(statsOutPkts, u32(uint32(w.stats32.PacketsOut)))
	st.AddRtAttr(statsInBytes, u64(w.stats32.BytesIn))
	st.AddRtAttr(statsOutBytes, u64(w.stats32.BytesOut))
	st.AddRtAttr(6, u32(0)) // IPVS_STATS_ATTR_CPS
	a.AddChild(st)
	st64 := nl.NewRtAttr(svcStats64|int(nl.NLA_F_NESTED), nil)
	for typ, v := range map[int]uint64{statsConns: w.vs.Stats.Connections, statsInPkts: w.vs.Stats.PacketsIn,
		statsOutPkts: w.vs.Stats.PacketsOut, statsInBytes: w.vs.Stats.BytesIn, statsOutBytes: w.vs.Stats.BytesOut} {
		st64.AddRtAttr(typ, u64(v))
	}
	a.AddChild(st64)
	return genlMsg(1, a)
}

func destMsg(rs RealServer, withAF bool) []byte {
	a := nl.NewRtAttr(attrCmdDest|int(nl.NLA_F_NESTED), nil)
	a.AddRtAttr(destAddr, addr16(rs.Address))
	a.AddRtAttr(destPort, binary.BigEndian.AppendUint16(nil, rs.Port))
	a.AddRtAttr(destFwdMethod, u32(fwdMasq))
	a.AddRtAttr(destWeight, u32(uint32(rs.Weight)))
	a.AddRtAttr(destActiveConns, u32(uint32(rs.ActiveConns)))
	a.AddRtAttr(destInactConns, u32(uint32(rs.InactiveConns)))
	a.AddRtAttr(9, u32(0)) // IPVS_DEST_ATTR_PERSIST_CONNS
	if withAF {
		a.AddRtAttr(destAF, u16(family(rs.Address)))
	}
	return genlMsg(5, a)
}

func part(seq uint32, payload []byte, flags uint16) []byte {
	return nlconntest.Part(testFamily, seq, payload, flags)
}

func scriptedHandle(t testing.TB, answer nlconntest.Answer) (*Handle, *nlconntest.Kernel) {
	c, k := nlconntest.New(t, answer)
	return &Handle{family: testFamily, dumps: c, writes: c}, k
}

var (
	wireA = wireService{
		vs: VirtualServer{ServiceKey: key(TCP, "10.96.0.1:443"), Scheduler: "rr", Flags: FlagPersistent, Timeout: 10800,
			Stats: Stats{Connections: 1 << 33, PacketsIn: 7, PacketsOut: 6, BytesIn: 1 << 40, BytesOut: 5}},
		stats32: Stats{Connections: 3, PacketsIn: 7, PacketsOut: 6, BytesIn: 1 << 40, BytesOut: 5},
	}
	wireB = wireService{vs: VirtualServer{ServiceKey: key(UDP, "[fd00::a]:53"), Scheduler: "mh", Flags: FlagSchedFlag1 | FlagSchedFlag2}}
	wireC = wireService{vs: VirtualServer{ServiceKey: key(SCTP, "10.96.0.3:9"), Scheduler: "nosuch-yet"}}
	// A firewall-mark service someone else made: skipped.
	wireMark = wireService{vs: VirtualServer{ServiceKey: ServiceKey{Address: netip.MustParseAddr("0.0.0.0")}, Scheduler: "rr"}, fwmark: 7}
)

// A service dump spread over datagrams, with a firewall-mark service and
// the kernel's hashed flag, arrives whole, parsed, in order.
func TestWalkVirtualServersWire(t *testing.T) {
	hashed := wireA
	hashed.vs.Flags |= FlagHashed
	h, k := scriptedHandle(t, func(_ int, seq uint32, _ []byte) []any {
		return []any{
			nlconntest.Join(part(seq, hashed.msg(), 0), part(seq, wireMark.msg(), 0)),
			nlconntest.Join(part(seq, wireB.msg(), 0), part(seq, wireC.msg(), 0), nlconntest.Done(seq, 0, 0)),
		}
	})
	got, err := h.ListVirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	want := []VirtualServer{wireA.vs, wireB.vs, wireC.vs}
	if !slices.Equal(got, want) {
		t.Errorf("walked\n%+v\nwant\n%+v", got, want)
	}
	// The request: the IPVS family, a dump, IPVS_CMD_GET_SERVICE.
	req := k.Reqs[0]
	if typ, flags := binary.NativeEndian.Uint16(req[4:]), binary.NativeEndian.Uint16(req[6:]); typ != testFamily || flags != unix.NLM_F_REQUEST|unix.NLM_F_DUMP || req[16] != cmdGetService || req[17] != genlVersion {
		t.Errorf("request header: type %#x flags %#x cmd %d version %d", typ, flags, req[16], req[17])
	}
}

// A dump flagged NLM_F_DUMP_INTR is read again after reset; the caller's
// map ends with the second reading only.
func TestWalkVirtualServersInterrupted(t *testing.T) {
	h, _ := scriptedHandle(t, func(n int, seq uint32, _ []byte) []any {
		if n != 1 {
			return []any{nlconntest.Join(part(seq, wireC.msg(), unix.NLM_F_DUMP_INTR), nlconntest.Done(seq, 0, unix.NLM_F_DUMP_INTR))}
		}
		return []any{nlconntest.Join(part(seq, wireA.msg(), 0), nlconntest.Done(seq, 0, 0))}
	})
	got, resets := map[ServiceKey]VirtualServer{}, 0
	err := h.WalkVirtualServers(func() { resets++; clear(got) }, func(vs VirtualServer) error {
		got[vs.ServiceKey] = vs
		return nil
	})
	if err != nil || resets != 1 || len(got) != 1 || got[wireA.vs.ServiceKey] != wireA.vs {
		t.Errorf("err %v, %d resets, %v; want only %v after 1 reset", err, resets, got, wireA.vs.ServiceKey)
	}
	// Without a reset the walk fails, worded like a list error.
	err = h.WalkVirtualServers(nil, func(VirtualServer) error { return nil })
	if !errors.Is(err, ErrDumpInterrupted) || err.Error() != "list virtual servers: "+ErrDumpInterrupted.Error() {
		t.Errorf("interrupted walk without reset: %v", err)
	}
}

// Real servers: the request names the service the way the kernel looks
// it up; destinations with and without their own family attribute (old
// kernels) parse; an error acknowledgement is an OpError with the errno;
// fn's own error comes back unwrapped.
func TestWalkRealServersWire(t *testing.T) {
	vs := key(TCP, "[fd00::1]:80")
	r1 := RealServer{RealKey: rkey("[fd00:244::5]:8080"), Weight: 3, ActiveConns: 2, InactiveConns: 9}
	r2 := RealServer{RealKey: rkey("[fd00:244::6]:8080"), Weight: 0}
	h, k := scriptedHandle(t, func(n int, seq uint32, _ []byte) []any {
		if n == 1 {
			return []any{nlconntest.Ack(seq, syscall.EPERM)}
		}
		return []any{nlconntest.Join(part(seq, destMsg(r1, true), 0), part(seq, destMsg(r2, false), 0), nlconntest.Done(seq, 0, 0))}
	})
	got, err := h.ListRealServers(vs)
	if err != nil || !slices.Equal(got, []RealServer{r1, r2}) {
		t.Errorf("ListRealServers = %+v, %v", got, err)
	}
	checkDestRequest(t, k.Reqs[0], vs)

	err = h.WalkRealServers(vs, nil, func(RealServer) error { return nil })
	var oe *OpError
	if !errors.As(err, &oe) || !errors.Is(err, syscall.EPERM) || err.Error() != "list real servers of tcp [fd00::1]:80: operation not permitted" {
		t.Errorf("error ack: %v", err)
	}
	stop := errors.New("stop")
	if err := h.WalkRealServers(vs, nil, func(RealServer) error { return stop }); err != stop {
		t.Errorf("fn's error came back as %v", err)
	}
	if err := h.WalkRealServers(ServiceKey{}, nil, func(RealServer) error { return nil }); err == nil {
		t.Error("walk of an invalid key reached the kernel")
	}
}

// checkDestRequest decodes an IPVS_CMD_GET_DEST request.
func checkDestRequest(t *testing.T, req []byte, vs ServiceKey) {
	t.Helper()
	if req[16] != cmdGetDest {
		t.Errorf("command %d, want IPVS_CMD_GET_DEST", req[16])
	}
	svc, err := nested(req[unix.NLMSG_HDRLEN:], attrCmdService)
	if err != nil {
		t.Fatal(err)
	}
	var got ServiceKey
	var af uint16
	for it := nlconn.Attrs(svc); it.Next(); {
		switch it.Type {
		case svcAF:
			af = binary.NativeEndian.Uint16(it.Value)
		case svcProtocol:
			got.Protocol = Protocol(binary.NativeEndian.Uint16(it.Value))
		case svcAddr:
			got.Address, _ = netip.AddrFromSlice(it.Value)
		case svcPort:
			got.Port = binary.BigEndian.Uint16(it.Value)
		}
	}
	if got != vs || af != syscall.AF_INET6 {
		t.Errorf("request names %v (family %d), want %v", got, af, vs)
	}
}

// Messages the parser must refuse rather than misread.
func TestParseRefusesBadMessages(t *testing.T) {
	short := wireA
	short.vs.Address = netip.MustParseAddr("fd00::1")
	short.addr = []byte{1, 2, 3, 4} // IPv6 family, 4 bytes of address
	for name, msg := range map[string][]byte{
		"short address": short.msg(),
		"no service":    genlMsg(1, nl.NewRtAttr(attrCmdDest, nil)),
		"truncated":     {1, 1},
	} {
		if _, _, err := parseServiceMsg(msg); err == nil {
			t.Errorf("%s: parsed", name)
		}
	}
}

// Parsing a message allocates nothing (the scheduler name is one of the
// kernel's): memory during a walk does not grow with the table.
func TestParseAllocatesNothing(t *testing.T) {
	svc, dst := wireA.msg(), destMsg(RealServer{RealKey: rkey("10.244.0.1:80"), Weight: 1}, true)
	if n := testing.AllocsPerRun(100, func() { _, _, _ = parseServiceMsg(svc) }); n != 0 {
		t.Errorf("parseServiceMsg: %v allocations per message", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = parseDestMsg(dst, syscall.AF_INET) }); n != 0 {
		t.Errorf("parseDestMsg: %v allocations per message", n)
	}
}
