//go:build sandbox

// Real-kernel tests for Handle. They run as root inside the user-mode-Linux
// sandbox (e2e/sandbox/uml-run), own its whole IPVS table, and fail, never
// skip, when they cannot: a skipped proof is no proof.
//
//	go test -tags sandbox -c -o bin/sandbox/ipvs.test ./ipvs &&
//	  (cd ipvs && ../e2e/sandbox/uml-run -- ../bin/sandbox/ipvs.test -test.v)
//
// (or `make sandbox-test`). The binary must live outside /tmp, which the
// guest mounts afresh. It cannot be built with -race: ThreadSanitizer's
// fixed shadow mappings do not fit user-mode Linux's address space.
package ipvs

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// TestMain gives real servers somewhere to live: a dummy link with routes
// for the pod ranges the tests use, as a node's pod network would.
func TestMain(m *testing.M) {
	if err := setupNetwork(); err != nil {
		fmt.Fprintln(os.Stderr, "sandbox setup:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

const testLink = "ipvstest0"

func setupNetwork() error {
	if os.Geteuid() != 0 {
		return errors.New("sandbox tests must run as root inside e2e/sandbox/uml-run")
	}
	if _, err := os.Stat("/proc/net/ip_vs"); err != nil {
		return fmt.Errorf("no IPVS in this kernel (%v): run inside e2e/sandbox/uml-run", err)
	}
	if l, err := netlink.LinkByName(testLink); err == nil {
		_ = netlink.LinkDel(l)
	}
	link := &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: testLink}}
	if err := netlink.LinkAdd(link); err != nil {
		return fmt.Errorf("add dummy link: %w", err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", testLink, err)
	}
	for _, cidr := range []string{"10.244.0.0/16", "fd00:244::/64"} {
		_, dst, _ := net.ParseCIDR(cidr)
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst}); err != nil {
			return fmt.Errorf("route %s: %w", cidr, err)
		}
	}
	return nil
}

// newHandle opens a Handle on an empty IPVS table with default timeouts.
func newHandle(t testing.TB) *Handle {
	t.Helper()
	h, err := New()
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(h.Close)
	flush(t, h)
	t.Cleanup(func() { flush(t, h) })
	return h
}

func flush(t testing.TB, h *Handle) {
	t.Helper()
	vss, err := h.ListVirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	for _, vs := range vss {
		if err := h.DeleteVirtualServer(vs.ServiceKey); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.SetTimeouts(defaultTimeouts); err != nil {
		t.Fatal(err)
	}
}

func ipvsadm(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ipvsadm", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ipvsadm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func svc(proto Protocol, addrPort string) ServiceKey {
	ap := netip.MustParseAddrPort(addrPort)
	return ServiceKey{Address: ap.Addr(), Protocol: proto, Port: ap.Port()}
}

func rk(addrPort string) RealKey {
	ap := netip.MustParseAddrPort(addrPort)
	return RealKey{Address: ap.Addr(), Port: ap.Port()}
}

// A step is one operation, run against the kernel and the Fake alike, and
// the outcome expected from both.
type step struct {
	name string
	do   func(Interface) error
	want string // "", "exist", "notexist" or "error"
}

func addVS(vs VirtualServer, want string) step {
	return step{"add " + vs.String(), func(i Interface) error { return i.AddVirtualServer(vs) }, want}
}

func updVS(vs VirtualServer, want string) step {
	return step{"update " + vs.String(), func(i Interface) error { return i.UpdateVirtualServer(vs) }, want}
}

func delVS(k ServiceKey, want string) step {
	return step{"delete " + k.String(), func(i Interface) error { return i.DeleteVirtualServer(k) }, want}
}

func addRS(k ServiceKey, rs string, w int32, want string) step {
	r := RealServer{RealKey: rk(rs), Weight: w}
	return step{"add " + rs + " to " + k.String(), func(i Interface) error { return i.AddRealServer(k, r) }, want}
}

func updRS(k ServiceKey, rs string, w int32, want string) step {
	r := RealServer{RealKey: rk(rs), Weight: w}
	return step{"update " + rs + " of " + k.String(), func(i Interface) error { return i.UpdateRealServer(k, r) }, want}
}

func delRS(k ServiceKey, rs string, want string) step {
	r := rk(rs)
	return step{"delete " + rs + " from " + k.String(), func(i Interface) error { return i.DeleteRealServer(k, r) }, want}
}

// run applies steps to the kernel and the Fake and checks that both give
// the expected outcome with the same error text.
func run(t *testing.T, h *Handle, f *Fake, steps []step) {
	t.Helper()
	for _, s := range steps {
		eh, ef := s.do(h), s.do(f)
		if outcomeOf(eh) != s.want || outcomeOf(ef) != s.want {
			t.Errorf("%s: kernel error %v (%q), fake error %v (%q), want %q", s.name, eh, outcomeOf(eh), ef, outcomeOf(ef), s.want)
			continue
		}
		if eh != nil && eh.Error() != ef.Error() {
			t.Errorf("%s: error texts differ:\nkernel: %v\nfake:   %v", s.name, eh, ef)
		}
	}
}

// dump lists everything through the Interface and prints it with FormatSave.
func dump(t *testing.T, i Interface) string {
	t.Helper()
	vss, err := i.ListVirtualServers()
	if err != nil {
		t.Fatal(err)
	}
	reals := map[ServiceKey][]RealServer{}
	for _, vs := range vss {
		if reals[vs.ServiceKey], err = i.ListRealServers(vs.ServiceKey); err != nil {
			t.Fatal(err)
		}
	}
	return FormatSave(vss, reals)
}

// assertSame is the central proof: what ipvsadm reads from the kernel after
// our Handle programmed it, what Handle reads back, and what the Fake
// prints after the same operations are one and the same text.
func assertSame(t *testing.T, h *Handle, f *Fake) {
	t.Helper()
	kernel := ipvsadm(t, "-Sn")
	if fake := f.String(); fake != kernel {
		t.Errorf("Fake.String() differs from ipvsadm -Sn\n--- ipvsadm -Sn:\n%s--- fake:\n%s", kernel, fake)
	}
	if got := dump(t, h); got != kernel {
		t.Errorf("Handle listing differs from ipvsadm -Sn\n--- ipvsadm -Sn:\n%s--- handle:\n%s", kernel, got)
	}
}

var (
	web     = svc(TCP, "10.96.0.1:443")
	dns     = svc(UDP, "10.96.0.10:53")
	sctp    = svc(SCTP, "10.96.0.11:9")
	shSvc   = svc(TCP, "10.96.0.12:80")
	mhSvc   = svc(UDP, "10.96.0.13:80")
	flagSvc = svc(TCP, "10.96.0.14:80")
	ops     = svc(UDP, "10.96.0.15:53")
	web6    = svc(TCP, "[fd00::1]:443")
	dns6    = svc(UDP, "[fd00::a]:53")
	gone    = svc(TCP, "10.96.0.99:80")
)

func TestSandboxFakeMatchesKernel(t *testing.T) {
	h, f := newHandle(t), NewFake()
	run(t, h, f, []step{
		addVS(VirtualServer{ServiceKey: web, Scheduler: "rr"}, ""),
		addRS(web, "10.244.1.5:6443", 1, ""),
		addRS(web, "10.244.1.10:6443", 1, ""),
		addRS(web, "10.244.1.9:6443", 0, ""),
		addRS(web, "10.244.1.9:443", 65535, ""),
		addVS(VirtualServer{ServiceKey: dns, Scheduler: "rr"}, ""),
		addRS(dns, "10.244.2.7:53", 1, ""),
		addVS(VirtualServer{ServiceKey: sctp, Scheduler: "wrr", Flags: FlagPersistent, Timeout: 10800}, ""),
		addRS(sctp, "10.244.2.8:9", 2, ""),
		addVS(VirtualServer{ServiceKey: shSvc, Scheduler: "sh", Flags: FlagSchedFlag1 | FlagSchedFlag2 | FlagPersistent, Timeout: 60}, ""),
		addVS(VirtualServer{ServiceKey: mhSvc, Scheduler: "mh", Flags: FlagSchedFlag2 | FlagOnePacket | FlagPersistent, Timeout: 5}, ""),
		addVS(VirtualServer{ServiceKey: flagSvc, Scheduler: "rr", Flags: FlagSchedFlag1 | FlagSchedFlag3}, ""),
		addVS(VirtualServer{ServiceKey: ops, Scheduler: "rr", Flags: FlagOnePacket | FlagPersistent, Timeout: 30}, ""),
		addVS(VirtualServer{ServiceKey: web6, Scheduler: "rr"}, ""),
		addRS(web6, "[fd00:244::10]:8443", 1, ""),
		addRS(web6, "[fd00:244::9]:8443", 1, ""),
		addVS(VirtualServer{ServiceKey: dns6, Scheduler: "lc", Flags: FlagPersistent, Timeout: 100}, ""),
		addRS(dns6, "[fd00:244::53]:53", 1, ""),
		// The hashed flag is the kernel's; writing it must be harmless.
		addVS(VirtualServer{ServiceKey: gone, Scheduler: "rr", Flags: FlagHashed}, ""),
		addRS(gone, "10.244.3.1:80", 1, ""),

		// Updates.
		updVS(VirtualServer{ServiceKey: web, Scheduler: "wrr"}, ""),
		updVS(VirtualServer{ServiceKey: dns, Scheduler: "rr", Flags: FlagPersistent, Timeout: 10800}, ""),
		updVS(VirtualServer{ServiceKey: sctp, Scheduler: "wrr"}, ""),
		updRS(web, "10.244.1.9:6443", 3, ""),
		updRS(web6, "[fd00:244::9]:8443", 0, ""),
		delRS(web, "10.244.1.10:6443", ""),
		delVS(gone, ""), // takes its real server with it

		// What the engine must be able to tell apart.
		addVS(VirtualServer{ServiceKey: web, Scheduler: "rr"}, "exist"),
		addRS(web, "10.244.1.5:6443", 1, "exist"),
		delVS(gone, "notexist"),
		updVS(VirtualServer{ServiceKey: gone, Scheduler: "rr"}, "notexist"),
		addRS(gone, "10.244.3.1:80", 1, "notexist"),
		updRS(gone, "10.244.3.1:80", 1, "notexist"),
		delRS(gone, "10.244.3.1:80", "notexist"),
		delRS(web, "10.244.1.10:6443", "notexist"),
		updRS(web, "10.244.1.10:6443", 1, "notexist"),
		// A missing scheduler module is an error, not "does not exist".
		addVS(VirtualServer{ServiceKey: gone, Scheduler: "nosuch"}, "error"),
		updVS(VirtualServer{ServiceKey: web, Scheduler: "nosuch"}, "error"),
		// Refused before reaching the kernel.
		addRS(web, "[fd00:244::1]:80", 1, "error"),
		addRS(web, "10.244.1.1:80", maxWeight+1, "error"),
	})
	assertSame(t, h, f)

	// Listing a service that does not exist is empty, not an error.
	for _, i := range []Interface{h, f} {
		rss, err := i.ListRealServers(gone)
		if err != nil || len(rss) != 0 {
			t.Errorf("%T.ListRealServers(missing) = %v, %v; want empty, nil", i, rss, err)
		}
	}
}

// TestSandboxListRoundTrip checks every field Handle reads back, beyond
// what ipvsadm -Sn shows.
func TestSandboxListRoundTrip(t *testing.T) {
	h, f := newHandle(t), NewFake()
	want := []VirtualServer{
		{ServiceKey: web, Scheduler: "rr"},
		{ServiceKey: dns, Scheduler: "sh", Flags: FlagSchedFlag1 | FlagSchedFlag2 | FlagOnePacket},
		{ServiceKey: sctp, Scheduler: "wlc", Flags: FlagPersistent, Timeout: 10800},
		{ServiceKey: web6, Scheduler: "mh", Flags: FlagPersistent | FlagSchedFlag1, Timeout: 1},
	}
	for _, vs := range want {
		for _, i := range []Interface{h, f} {
			if err := i.AddVirtualServer(vs); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, i := range []Interface{h, f} {
		got, err := i.ListVirtualServers()
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(got, func(a, b VirtualServer) int { return CompareServiceKeys(a.ServiceKey, b.ServiceKey) })
		if !slices.EqualFunc(got, want, VirtualServer.Equal) {
			t.Errorf("%T lists\n%v\nwant\n%v", i, got, want)
		}
		for _, vs := range got {
			if vs.Flags&FlagHashed != 0 || vs.Stats != (Stats{}) {
				t.Errorf("%T: %v: flags %#x stats %+v; want no hashed flag, zero stats", i, vs.ServiceKey, vs.Flags, vs.Stats)
			}
		}
	}
	rs := RealServer{RealKey: rk("[fd00:244::5]:8080"), Weight: 7}
	if err := h.AddRealServer(web6, rs); err != nil {
		t.Fatal(err)
	}
	got, err := h.ListRealServers(web6)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != rs {
		t.Errorf("ListRealServers = %+v, want [%+v]", got, rs)
	}
}

func TestSandboxTimeouts(t *testing.T) {
	h, f := newHandle(t), NewFake()
	for _, i := range []Interface{h, f} {
		got, err := i.GetTimeouts()
		if err != nil || got != defaultTimeouts {
			t.Fatalf("%T.GetTimeouts() = %+v, %v; want kernel defaults %+v", i, got, err, defaultTimeouts)
		}
	}
	steps := []struct {
		set, want Timeouts
		ipvsadm   string
	}{
		{Timeouts{TCP: 1000 * time.Second}, Timeouts{1000 * time.Second, 120 * time.Second, 300 * time.Second}, "1000 120 300"},
		{Timeouts{TCPFin: 5 * time.Second, UDP: 10 * time.Second}, Timeouts{1000 * time.Second, 5 * time.Second, 10 * time.Second}, "1000 5 10"},
		{Timeouts{}, Timeouts{1000 * time.Second, 5 * time.Second, 10 * time.Second}, "1000 5 10"},
		{Timeouts{UDP: 100 * time.Millisecond}, Timeouts{1000 * time.Second, 5 * time.Second, time.Second}, "1000 5 1"},
	}
	for _, s := range steps {
		for _, i := range []Interface{h, f} {
			if err := i.SetTimeouts(s.set); err != nil {
				t.Fatalf("%T.SetTimeouts(%+v): %v", i, s.set, err)
			}
			if got, err := i.GetTimeouts(); err != nil || got != s.want {
				t.Errorf("%T after SetTimeouts(%+v): %+v, %v; want %+v", i, s.set, got, err, s.want)
			}
		}
		if got := ipvsadm(t, "-Ln", "--timeout"); got != "Timeout (tcp tcpfin udp): "+s.ipvsadm+"\n" {
			t.Errorf("ipvsadm -Ln --timeout = %q, want %s", got, s.ipvsadm)
		}
	}
	for _, i := range []Interface{h, f} {
		if err := i.SetTimeouts(Timeouts{TCP: -time.Second}); err == nil {
			t.Errorf("%T accepted a negative timeout", i)
		}
	}
}

func TestSandboxErrorText(t *testing.T) {
	h := newHandle(t)
	err := h.AddRealServer(web, RealServer{RealKey: rk("10.244.1.5:80"), Weight: 1})
	const want = "add real server 10.244.1.5:80 to tcp 10.96.0.1:443: no such service"
	if err == nil || err.Error() != want {
		t.Errorf("error = %v, want %q", err, want)
	}
	if err := h.AddVirtualServer(VirtualServer{ServiceKey: web6, Scheduler: "rr"}); err != nil {
		t.Fatal(err)
	}
	err = h.AddVirtualServer(VirtualServer{ServiceKey: web6, Scheduler: "rr"})
	if want := "add virtual server tcp [fd00::1]:443: service already exists"; err == nil || err.Error() != want {
		t.Errorf("error = %v, want %q", err, want)
	}
}

// TestSandboxUnicastOnly documents a kernel rule the engine will meet: a
// real server on the broadcast address of a connected subnet is EINVAL.
func TestSandboxUnicastOnly(t *testing.T) {
	h := newHandle(t)
	link, err := netlink.LinkByName(testLink)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("10.245.0.1/24")
	if err := netlink.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.AddrDel(link, addr) })
	if err := h.AddVirtualServer(VirtualServer{ServiceKey: web, Scheduler: "rr"}); err != nil {
		t.Fatal(err)
	}
	err = h.AddRealServer(web, RealServer{RealKey: rk("10.245.0.255:80"), Weight: 1})
	if !errors.Is(err, syscall.EINVAL) || IsExist(err) || IsNotExist(err) {
		t.Errorf("broadcast real server: %v; want EINVAL, neither exist nor not-exist", err)
	}
}

// TestSandboxSchedulers checks SchedulerAvailable against the kernel: the
// schedulers it reports available are accepted by AddVirtualServer.
func TestSandboxSchedulers(t *testing.T) {
	h := newHandle(t)
	for i, name := range []string{"rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "mh"} {
		if err := SchedulerAvailable(name); err != nil {
			t.Errorf("SchedulerAvailable(%s): %v", name, err)
		}
		vs := VirtualServer{ServiceKey: ServiceKey{Address: web.Address, Protocol: TCP, Port: uint16(1000 + i)}, Scheduler: name}
		if err := h.AddVirtualServer(vs); err != nil {
			t.Errorf("scheduler %s: %v", name, err)
		}
	}
	if err := SchedulerAvailable("nosuch"); err == nil {
		t.Error(`SchedulerAvailable("nosuch") = nil`)
	}
}
