//go:build sandbox

package ipvs

import (
	"fmt"
	"net/netip"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"
)

// Large dumps on the real kernel. The tables are programmed by ipvsadm -R
// (one process, and a writer independent of the code under test), then
// walked and compared entry by entry. Dumps are read-only, so no traffic
// is sent: that the programmed virtual servers answer is proven by the
// tests that program them (TestSandboxConnectionCounts here, the e2e
// suite for the proxy).

const (
	bigServices = 20_000
	bigReals    = 2_000
)

// bigTable is what the test programs: bigServices virtual servers of
// every protocol and both families, some persistent or with scheduler
// flags, and one (the first) with bigReals real servers.
func bigTable() (map[ServiceKey]VirtualServer, map[RealKey]RealServer, string) {
	vss := make(map[ServiceKey]VirtualServer, bigServices)
	reals := make(map[RealKey]RealServer, bigReals)
	var rules strings.Builder
	protos := []Protocol{TCP, UDP, SCTP}
	opt := map[Protocol]string{TCP: "-t", UDP: "-u", SCTP: "--sctp-service"}
	for i := range bigServices {
		addr := netip.AddrFrom4([4]byte{10, 100, byte(i >> 8), byte(i)})
		if i%5 == 4 {
			addr = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x64, 14: byte(i >> 8), 15: byte(i)})
		}
		vs := VirtualServer{ServiceKey: ServiceKey{Address: addr, Protocol: protos[i%3], Port: uint16(1 + i%1000)}, Scheduler: "rr"}
		extra := ""
		switch {
		case i%7 == 1:
			vs.Flags, vs.Timeout = FlagPersistent, uint32(60+i%100)
			extra = fmt.Sprintf(" -p %d", vs.Timeout)
		case i%7 == 2:
			vs.Scheduler, vs.Flags = "sh", FlagSchedFlag1|FlagSchedFlag2
			extra = " -b sh-fallback,sh-port"
		}
		vss[vs.ServiceKey] = vs
		fmt.Fprintf(&rules, "-A %s %s -s %s%s\n", opt[vs.Protocol], netip.AddrPortFrom(addr, vs.Port), vs.Scheduler, extra)
	}
	first := ServiceKey{Address: netip.AddrFrom4([4]byte{10, 100, 0, 0}), Protocol: TCP, Port: 1}
	for j := range bigReals {
		rs := RealServer{RealKey: RealKey{Address: netip.AddrFrom4([4]byte{10, 244, byte(j >> 8), byte(j)}), Port: 8080}, Weight: int32(j % 5)}
		reals[rs.RealKey] = rs
		fmt.Fprintf(&rules, "-a -t %s -r %s -m -w %d\n", netip.AddrPortFrom(first.Address, first.Port), rs.RealKey, rs.Weight)
	}
	return vss, reals, rules.String()
}

func TestSandboxWalkLargeTables(t *testing.T) {
	h := newHandle(t)
	want, wantReals, rules := bigTable()
	start := time.Now()
	restore := exec.Command("ipvsadm", "-R")
	restore.Stdin = strings.NewReader(rules)
	if out, err := restore.CombinedOutput(); err != nil {
		t.Fatalf("ipvsadm -R: %v\n%s", err, out)
	}
	// Runs before newHandle's flush, which would delete one by one.
	t.Cleanup(func() { ipvsadm(t, "-C") })
	t.Logf("programmed %d virtual servers and %d real servers with ipvsadm -R in %v", bigServices, bigReals, time.Since(start))

	// Every virtual server comes back exactly once, as programmed. The
	// check allocates nothing, so what the walk allocates is measured.
	seen := make(map[ServiceKey]bool, bigServices)
	var bad []string
	start = time.Now()
	allocated, mallocs := measure(func() {
		err := h.WalkVirtualServers(func() { clear(seen) }, func(vs VirtualServer) error {
			if w, ok := want[vs.ServiceKey]; !ok || !w.Equal(vs) || seen[vs.ServiceKey] {
				bad = append(bad, fmt.Sprintf("%+v", vs))
			}
			seen[vs.ServiceKey] = true
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})
	elapsed := time.Since(start)
	if len(bad) > 0 || len(seen) != bigServices {
		t.Fatalf("walked %d of %d virtual servers; %d wrong, the first: %v", len(seen), bigServices, len(bad), bad[:min(len(bad), 3)])
	}
	// The memory bound: collecting the dump in a slice would cost at least
	// bigServices × sizeof(VirtualServer) (1.9 MB) and one allocation per
	// service in moby/ipvs. The walk allocates per request and per
	// datagram (a 32 KiB batch of ~150 services), never per service:
	// TotalAlloc, which counts every byte allocated whatever the garbage
	// collector does, must stay under a tenth of the slice, and the
	// number of allocations under one per hundred services.
	slice := uint64(bigServices) * uint64(unsafe.Sizeof(VirtualServer{}))
	t.Logf("walked %d virtual servers in %v: %d bytes in %d allocations (a collected slice: %d bytes)", bigServices, elapsed, allocated, mallocs, slice)
	if allocated > slice/10 || mallocs > bigServices/100 {
		t.Errorf("the walk allocated %d bytes in %d allocations; want < %d bytes and < %d allocations", allocated, mallocs, slice/10, bigServices/100)
	}

	// The real servers of the big one, walked from inside the service
	// walk: the nested dump gets a socket of its own instead of waiting
	// for the busy one.
	got := map[RealKey]RealServer{}
	err := h.WalkVirtualServers(nil, func(vs VirtualServer) error {
		if vs.Port != 1 || vs.Protocol != TCP || vs.Address != netip.AddrFrom4([4]byte{10, 100, 0, 0}) {
			return nil
		}
		return h.WalkRealServers(vs.ServiceKey, func() { clear(got) }, func(rs RealServer) error {
			if _, dup := got[rs.RealKey]; dup {
				return fmt.Errorf("real server %v handed over twice", rs.RealKey)
			}
			got[rs.RealKey] = rs
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != bigReals {
		t.Fatalf("walked %d real servers, want %d", len(got), bigReals)
	}
	for k, rs := range wantReals {
		if got[k] != rs {
			t.Fatalf("real server %v: walked %+v, programmed %+v", k, got[k], rs)
		}
	}
}

// measure runs f and returns the bytes and objects it allocated.
func measure(f func()) (bytes, objects uint64) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc, after.Mallocs - before.Mallocs
}
