package ipvs

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ipvsproxy/ipvsproxy/internal/nlconn"
	"github.com/ipvsproxy/ipvsproxy/internal/nlconn/nlconntest"
)

// The write requests, read back attribute by attribute the way the
// kernel's ip_vs_genl_parse_service/_dest read them. The sandbox tests
// and benchmark send the same requests to the real kernel.

// wireText prints an IPVS request: the command, then each nested
// attribute's fields by their ip_vs.h names, values in hex as sent.
func wireText(t *testing.T, req []byte) string {
	t.Helper()
	if len(req) < unix.NLMSG_HDRLEN+4 {
		t.Fatalf("short request: %x", req)
	}
	typ, flags := binary.NativeEndian.Uint16(req[4:]), binary.NativeEndian.Uint16(req[6:])
	if typ != testFamily || flags != unix.NLM_F_REQUEST|unix.NLM_F_ACK || req[17] != genlVersion {
		t.Errorf("header: type %#x flags %#x version %d; want the IPVS family, an acknowledged request, version 1", typ, flags, req[17])
	}
	names := map[uint16]map[uint16]string{
		attrCmdService: {svcAF: "af", svcProtocol: "proto", svcAddr: "addr", svcPort: "port", svcSchedName: "sched",
			svcFlags: "flags", svcTimeout: "timeout", svcNetmask: "netmask"},
		attrCmdDest: {destAddr: "addr", destPort: "port", destFwdMethod: "fwd", destWeight: "weight",
			destUThreshold: "u_thresh", destLThreshold: "l_thresh"},
	}
	out := []string{fmt.Sprintf("cmd %d", req[16])}
	for top := nlconn.Attrs(req[unix.NLMSG_HDRLEN+4:]); top.Next(); {
		fields := []string{map[uint16]string{attrCmdService: "service", attrCmdDest: "dest"}[top.Type]}
		for it := nlconn.Attrs(top.Value); it.Next(); {
			name, ok := names[top.Type][it.Type]
			if !ok {
				name = fmt.Sprint(it.Type)
			}
			fields = append(fields, name+"="+hex.EncodeToString(it.Value))
		}
		out = append(out, strings.Join(fields, " "))
	}
	return strings.Join(out, "\n")
}

// Each write is one request with exactly the attributes the kernel needs
// for it; numbers in host order, ports in network order, IPv4 addresses
// in 4 bytes, strings zero-terminated. (Hex below is little-endian host
// order, as on amd64 and arm64.)
func TestWriteRequestsWire(t *testing.T) {
	h, k := scriptedHandle(t, func(_ int, seq uint32, _ []byte) []any { return []any{nlconntest.Ack(seq, 0)} })
	v4 := key(TCP, "10.96.0.1:443")
	v6 := key(UDP, "[fd00::a]:53")
	rs := RealServer{RealKey: rkey("10.244.1.5:8443"), Weight: 3}
	for _, call := range []func() error{
		func() error {
			return h.AddVirtualServer(VirtualServer{ServiceKey: v4, Scheduler: "rr", Flags: FlagPersistent | FlagHashed, Timeout: 10800})
		},
		func() error {
			return h.UpdateVirtualServer(VirtualServer{ServiceKey: v6, Scheduler: "mh", Flags: FlagSchedFlag1})
		},
		func() error { return h.DeleteVirtualServer(v4) },
		func() error { return h.AddRealServer(v4, rs) },
		func() error { return h.UpdateRealServer(v4, RealServer{RealKey: rs.RealKey, Weight: 0}) },
		func() error { return h.DeleteRealServer(v4, rs.RealKey) },
	} {
		if err := call(); err != nil {
			t.Fatal(err)
		}
	}
	const svc4 = "service af=0200 proto=0600 addr=0a600001 port=01bb"
	want := []string{
		"cmd 1\n" + svc4 + " sched=727200 flags=01000000ffffffff timeout=302a0000 netmask=ffffffff",
		"cmd 2\nservice af=0a00 proto=1100 addr=fd00000000000000000000000000000a port=0035 sched=6d6800 flags=08000000ffffffff timeout=00000000 netmask=80000000",
		"cmd 3\n" + svc4,
		"cmd 5\n" + svc4 + "\ndest addr=0af40105 port=20fb fwd=00000000 weight=03000000 u_thresh=00000000 l_thresh=00000000",
		"cmd 6\n" + svc4 + "\ndest addr=0af40105 port=20fb fwd=00000000 weight=00000000 u_thresh=00000000 l_thresh=00000000",
		"cmd 7\n" + svc4 + "\ndest addr=0af40105 port=20fb",
	}
	k.ExpectRequests(func(req []byte) string { return wireText(t, req) }, want)
}

// The kernel's refusal comes back as the OpError callers test with
// IsExist and IsNotExist; a request that fails validation never reaches
// the kernel.
func TestWriteErrors(t *testing.T) {
	errnos := []unix.Errno{syscall.EEXIST, syscall.ESRCH, syscall.ENOENT}
	h, k := scriptedHandle(t, func(n int, seq uint32, _ []byte) []any { return []any{nlconntest.Ack(seq, errnos[n])} })
	vs := key(TCP, "10.96.0.1:443")
	err := h.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"})
	if !IsExist(err) || err.Error() != "add virtual server tcp 10.96.0.1:443: service already exists" {
		t.Errorf("EEXIST: %v", err)
	}
	if err := h.DeleteVirtualServer(vs); !IsNotExist(err) {
		t.Errorf("ESRCH: %v", err)
	}
	if err := h.DeleteRealServer(vs, rkey("10.244.1.5:8443")); !IsNotExist(err) {
		t.Errorf("ENOENT: %v", err)
	}
	if err := h.AddRealServer(vs, RealServer{RealKey: rkey("[fd00::5]:8443")}); err == nil {
		t.Error("an IPv6 real server of an IPv4 virtual server was accepted")
	}
	if len(k.Reqs) != 3 {
		t.Errorf("%d requests reached the kernel, want 3", len(k.Reqs))
	}
}
