//go:build sandbox

package ipvs

import (
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// TestSandboxConcurrentUse drives one Handle from many goroutines. Without
// the Handle's mutex, moby/ipvs goroutines read each other's replies and
// hang or misreport; here every call must succeed, finish, and leave
// exactly the state a Fake given the same calls has.
func TestSandboxConcurrentUse(t *testing.T) {
	h, f := newHandle(t), NewFake()
	const workers, perWorker = 8, 25
	done := make(chan struct{})
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range perWorker {
				if err := churn(h, f, w, i); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("concurrent calls on one Handle did not finish in 2 minutes: deadlock")
	}
	assertSame(t, h, f)
}

// churn is one worker's unit of work on its own service, applied to the
// kernel and the Fake: add, fill, reweight, list, shrink, and every third
// time delete the whole service again.
func churn(h *Handle, f *Fake, w, i int) error {
	vs := ServiceKey{Address: netip.AddrFrom4([4]byte{10, 97, byte(w), byte(i)}), Protocol: TCP, Port: 80}
	reals := make([]RealServer, 3)
	for j := range reals {
		reals[j] = RealServer{RealKey: RealKey{Address: netip.AddrFrom4([4]byte{10, 244, byte(w), byte(i)}), Port: uint16(8080 + j)}, Weight: 1}
	}
	for _, impl := range []Interface{h, f} {
		if err := impl.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}); err != nil {
			return err
		}
		for _, rs := range reals {
			if err := impl.AddRealServer(vs, rs); err != nil {
				return err
			}
		}
		if err := impl.UpdateRealServer(vs, RealServer{RealKey: reals[0].RealKey, Weight: 5}); err != nil {
			return err
		}
		if got, err := impl.ListRealServers(vs); err != nil || len(got) != 3 {
			return fmt.Errorf("%T: list %v: %d real servers, %v", impl, vs, len(got), err)
		}
		if _, err := impl.ListVirtualServers(); err != nil {
			return err
		}
		if err := impl.DeleteRealServer(vs, reals[2].RealKey); err != nil {
			return err
		}
		if i%3 == 0 {
			if err := impl.DeleteVirtualServer(vs); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestSandboxScale programs 2,000 virtual servers with 3 real servers each
// and reads them all back: the size at which kube-proxy's syncs take
// seconds (kubernetes#88212).
func TestSandboxScale(t *testing.T) {
	h, f := newHandle(t), NewFake()
	const services, reals = 2000, 3
	start := time.Now()
	for i := range services {
		vs := VirtualServer{
			ServiceKey: ServiceKey{Address: netip.AddrFrom4([4]byte{10, 98, byte(i >> 8), byte(i)}), Protocol: Protocol([]Protocol{TCP, UDP}[i%2]), Port: uint16(i)},
			Scheduler:  "rr",
		}
		for _, impl := range []Interface{h, f} {
			if err := impl.AddVirtualServer(vs); err != nil {
				t.Fatal(err)
			}
			for j := range reals {
				rs := RealServer{RealKey: RealKey{Address: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}), Port: uint16(1000 + j)}, Weight: 1}
				if err := impl.AddRealServer(vs.ServiceKey, rs); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	added := time.Since(start)
	start = time.Now()
	vss, err := h.ListVirtualServers()
	if err != nil || len(vss) != services {
		t.Fatalf("ListVirtualServers: %d services, %v; want %d", len(vss), err, services)
	}
	listed := time.Since(start)
	start = time.Now()
	n := 0
	for _, vs := range vss {
		rss, err := h.ListRealServers(vs.ServiceKey)
		if err != nil {
			t.Fatal(err)
		}
		n += len(rss)
	}
	t.Logf("%d services x %d real servers: added in %v, services listed in %v, all real servers (%d) listed in %v",
		services, reals, added, listed, n, time.Since(start))
	assertSame(t, h, f)
}

// TestSandboxConnectionCounts proves ActiveConns/InactiveConns are read
// from the kernel, which graceful termination depends on: a real TCP
// connection through a virtual server shows as active while open and
// inactive once closed.
func TestSandboxConnectionCounts(t *testing.T) {
	h := newHandle(t)
	link, err := netlink.LinkByName(testLink)
	if err != nil {
		t.Fatal(err)
	}
	// The VIP and the backend are both local addresses, so the kernel
	// delivers locally and no second network namespace is needed.
	for _, a := range []string{"10.96.50.1/32", "10.96.51.1/32"} {
		addr, _ := netlink.ParseAddr(a)
		if err := netlink.AddrAdd(link, addr); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netlink.AddrDel(link, addr) })
	}
	ln, err := net.Listen("tcp", "10.96.51.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = c.Read(make([]byte, 1)); c.Close() }()
		}
	}()
	vs := svc(TCP, "10.96.50.1:80")
	backend := rk("10.96.51.1:8080")
	if err := h.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}); err != nil {
		t.Fatal(err)
	}
	if err := h.AddRealServer(vs, RealServer{RealKey: backend, Weight: 1}); err != nil {
		t.Fatal(err)
	}
	conn, err := net.DialTimeout("tcp", "10.96.50.1:80", 5*time.Second)
	if err != nil {
		t.Fatalf("connect through the virtual server: %v", err)
	}
	waitConns(t, h, vs, func(rs RealServer) bool { return rs.ActiveConns == 1 }, "1 active connection")
	conn.Close()
	waitConns(t, h, vs, func(rs RealServer) bool { return rs.ActiveConns == 0 && rs.InactiveConns >= 1 }, "0 active, >=1 inactive")

	// The kernel folds its per-CPU counters into the listed stats from a
	// timer every 2 seconds, so they lag.
	var st Stats
	for deadline := time.Now().Add(6 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		vss, err := h.ListVirtualServers()
		if err != nil || len(vss) != 1 {
			t.Fatalf("ListVirtualServers: %v, %v", vss, err)
		}
		if st = vss[0].Stats; st.Connections == 1 && st.PacketsIn > 0 && st.BytesIn > 0 {
			return
		}
	}
	t.Errorf("stats after one connection: %+v; want 1 connection, packets and bytes in", st)
}

func waitConns(t *testing.T, h *Handle, vs ServiceKey, ok func(RealServer) bool, want string) {
	t.Helper()
	var rss []RealServer
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var err error
		if rss, err = h.ListRealServers(vs); err != nil {
			t.Fatal(err)
		}
		if len(rss) == 1 && ok(rss[0]) {
			return
		}
	}
	t.Fatalf("real servers %+v; want %s", rss, want)
}

// BenchmarkSandboxWrites is the write path against the real kernel: per
// iteration a virtual server, its 10 real servers, one weight change and
// the virtual server's deletion (13 writes, the shape of a service's
// life). B/op and allocs/op are what the writes cost the Go heap; ns/op
// includes the (emulated, slow) kernel and its system calls.
func BenchmarkSandboxWrites(b *testing.B) {
	h := newHandle(b)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		vs := ServiceKey{Address: netip.AddrFrom4([4]byte{10, 98, byte(i >> 8), byte(i)}), Protocol: TCP, Port: 80}
		i++
		if err := h.AddVirtualServer(VirtualServer{ServiceKey: vs, Scheduler: "rr"}); err != nil {
			b.Fatal(err)
		}
		for j := range 10 {
			rs := RealServer{RealKey: RealKey{Address: netip.AddrFrom4([4]byte{10, 244, 9, byte(j)}), Port: 8080}, Weight: 1}
			if err := h.AddRealServer(vs, rs); err != nil {
				b.Fatal(err)
			}
		}
		if err := h.UpdateRealServer(vs, RealServer{RealKey: RealKey{Address: netip.AddrFrom4([4]byte{10, 244, 9, 0}), Port: 8080}, Weight: 0}); err != nil {
			b.Fatal(err)
		}
		if err := h.DeleteVirtualServer(vs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(13, "writes/op")
}
