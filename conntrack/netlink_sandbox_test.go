//go:build sandbox

// Real-kernel tests with real traffic: run as root inside the
// user-mode-Linux sandbox (e2e/sandbox/uml-run). They never skip.
package conntrack

import (
	"net"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
)

// echoEnv, when set, turns the test binary into a UDP echo server on the
// listed comma-separated addresses: the "pod" process, started inside the
// pod network namespace with `ip netns exec`.
const echoEnv = "CONNTRACK_SANDBOX_UDP_ECHO"

func TestMain(m *testing.M) {
	if addrs := os.Getenv(echoEnv); addrs != "" {
		udpEcho(strings.Split(addrs, ","))
		return
	}
	os.Exit(m.Run())
}

func udpEcho(addrs []string) {
	for _, a := range addrs {
		pc, err := net.ListenPacket("udp", a)
		if err != nil {
			os.Stderr.WriteString("echo: " + err.Error() + "\n")
			os.Exit(1)
		}
		go func() {
			buf := make([]byte, 1500)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				_, _ = pc.WriteTo(buf[:n], from)
			}
		}()
	}
	select {}
}

var (
	vip     = netip.MustParseAddr("10.96.0.20")
	podIP   = netip.MustParseAddr("10.244.1.2")
	podPort = uint16(5353)
)

// setupPod builds: netns "pod" behind a veth (host 10.244.1.1/24, pod
// 10.244.1.2/24) running a UDP echo on :5353 and :5354; kube-ipvs0 with
// the VIP; IPVS UDP services 10.96.0.20:53 and :54, both to 10.244.1.2:5353.
func setupPod(t *testing.T) {
	t.Helper()
	sandboxtest.RequireRoot(t)
	for _, c := range [][]string{
		{"sysctl", "-qw", "net.ipv4.vs.conntrack=1"},
		// Conntrack only tracks a namespace once something needs it; on a
		// node that is kube-proxy's nat rules. Same here.
		{sandboxtest.IPTablesTool(t, false, ""), "-t", "nat", "-A", "POSTROUTING", "-m", "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT"},
		{"ip", "netns", "add", "pod"},
		{"ip", "link", "add", "veth-host", "type", "veth", "peer", "name", "veth-pod"},
		{"ip", "link", "set", "veth-pod", "netns", "pod"},
		{"ip", "addr", "add", "10.244.1.1/24", "dev", "veth-host"},
		{"ip", "link", "set", "veth-host", "up"},
		{"ip", "-n", "pod", "addr", "add", "10.244.1.2/24", "dev", "veth-pod"},
		{"ip", "-n", "pod", "link", "set", "veth-pod", "up"},
		{"ip", "-n", "pod", "link", "set", "lo", "up"},
		{"ip", "-n", "pod", "route", "add", "default", "via", "10.244.1.1"},
		{"ip", "link", "add", "kube-ipvs0", "type", "dummy"},
		{"ip", "addr", "add", "10.96.0.20/32", "dev", "kube-ipvs0"},
		{"ipvsadm", "-A", "-u", "10.96.0.20:53", "-s", "rr"},
		{"ipvsadm", "-a", "-u", "10.96.0.20:53", "-r", "10.244.1.2:5353", "-m"},
		{"ipvsadm", "-A", "-u", "10.96.0.20:54", "-s", "rr"},
		{"ipvsadm", "-a", "-u", "10.96.0.20:54", "-r", "10.244.1.2:5353", "-m"},
	} {
		sandboxtest.Run(t, c[0], c[1:]...)
	}
	echo := exec.Command("ip", "netns", "exec", "pod", os.Args[0])
	echo.Env = append(os.Environ(), echoEnv+"=0.0.0.0:5353,0.0.0.0:5354")
	echo.Stderr = os.Stderr
	if err := echo.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = echo.Process.Kill()
		_ = echo.Wait()
		for _, c := range [][]string{
			{"ipvsadm", "-D", "-u", "10.96.0.20:53"},
			{"ipvsadm", "-D", "-u", "10.96.0.20:54"},
			{"ip", "link", "del", "kube-ipvs0"},
			{"ip", "link", "del", "veth-host"},
			{"ip", "netns", "del", "pod"},
			{sandboxtest.IPTablesTool(t, false, ""), "-t", "nat", "-D", "POSTROUTING", "-m", "conntrack", "--ctstate", "DNAT", "-j", "ACCEPT"},
			{"conntrack", "-F"},
		} {
			_ = exec.Command(c[0], c[1:]...).Run()
		}
	})
}

// exchange sends one datagram to dst from a fresh socket and waits for the
// echo, retrying while the echo server starts. It returns the local port.
func exchange(t *testing.T, dst netip.AddrPort) uint16 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(dst))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte("ping"))
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		buf := make([]byte, 16)
		n, err := c.Read(buf)
		port := uint16(c.LocalAddr().(*net.UDPAddr).Port)
		c.Close()
		if err == nil && string(buf[:n]) == "ping" {
			return port
		}
		if time.Now().After(deadline) {
			t.Fatalf("no UDP echo from %s: %v", dst, err)
		}
	}
}

var ctLine = regexp.MustCompile(`^(\w+)\s+(\d+) (\d+) src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+) (\[UNREPLIED\] )?src=(\S+) dst=(\S+) sport=(\d+) dport=(\d+) (\[ASSURED\] )?mark=(\d+) use=1$`)

// listUDP runs `conntrack -L -p udp` and parses every line into an Entry,
// checking each parses back to the identical line through Entry.String.
func listUDP(t *testing.T) []Entry {
	t.Helper()
	out, err := exec.Command("conntrack", "-L", "-p", "udp").Output() // summary goes to stderr
	if err != nil {
		t.Fatalf("conntrack -L -p udp: %v", err)
	}
	var entries []Entry
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l == "" {
			continue
		}
		m := ctLine.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("conntrack line not in the expected format:\n%s", l)
		}
		num := func(i int) uint64 { v, _ := strconv.ParseUint(m[i], 10, 32); return v }
		ap := func(a, p int) netip.AddrPort {
			return netip.AddrPortFrom(netip.MustParseAddr(m[a]), uint16(num(p)))
		}
		e := Entry{
			Proto: uint8(num(2)), Timeout: uint32(num(3)),
			OrigSrc: ap(4, 6), OrigDst: ap(5, 7),
			Replied: m[8] == "", ReplySrc: ap(9, 11), ReplyDst: ap(10, 12),
			Assured: m[13] != "", Mark: uint32(num(14)),
		}
		if e.String() != l {
			t.Fatalf("Entry.String differs from conntrack -L:\n got %q\nwant %q", e.String(), l)
		}
		entries = append(entries, e)
	}
	return entries
}

func findByDst(entries []Entry, dst netip.AddrPort) (Entry, bool) {
	for _, e := range entries {
		if e.OrigDst == dst {
			return e, true
		}
	}
	return Entry{}, false
}

func countByDst(entries []Entry, dst netip.AddrPort) int {
	n := 0
	for _, e := range entries {
		if e.OrigDst == dst {
			n++
		}
	}
	return n
}

func TestSandboxDeleteUDPRealTraffic(t *testing.T) {
	setupPod(t)
	svc53 := netip.AddrPortFrom(vip, 53)
	svc54 := netip.AddrPortFrom(vip, 54)
	direct := netip.AddrPortFrom(podIP, 5354)
	exchange(t, svc53)
	exchange(t, svc54)
	exchange(t, direct)
	t.Logf("ipvsadm -Ln --stats:\n%s", sandboxtest.Run(t, "ipvsadm", "-Ln", "--stats"))
	t.Logf("ipvsadm -Lnc:\n%s", sandboxtest.Run(t, "ipvsadm", "-Lnc"))

	before := listUDP(t)
	t.Logf("conntrack -L -p udp before:\n%s", sandboxtest.Run(t, "conntrack", "-L", "-p", "udp"))
	e53, ok := findByDst(before, svc53)
	if !ok {
		t.Fatalf("no conntrack entry for %s", svc53)
	}
	if e53.ReplySrc != netip.AddrPortFrom(podIP, podPort) {
		t.Fatalf("entry for %s replies from %s, want the backend %s:%d", svc53, e53.ReplySrc, podIP, podPort)
	}
	for _, dst := range []netip.AddrPort{svc54, direct} {
		if _, ok := findByDst(before, dst); !ok {
			t.Fatalf("no conntrack entry for %s", dst)
		}
	}

	n, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	other := netip.MustParseAddr("10.244.9.9")
	// Another backend of the same service: must not match.
	got, err := n.DeleteUDP([]Flow{{Destination: vip, Port: 53, Backend: other}})
	if err != nil || got != 0 {
		t.Fatalf("DeleteUDP for backend %s = %d, %v; want 0, nil", other, got, err)
	}
	// Datagrams sent while the echo server was starting left more than
	// one (unreplied) entry: all of them go.
	want := countByDst(before, svc53)
	got, err = n.DeleteUDP([]Flow{{Destination: vip, Port: 53, Backend: podIP}})
	if err != nil || got != want {
		t.Fatalf("DeleteUDP(%s → %s) = %d, %v; want %d, nil", svc53, podIP, got, err, want)
	}
	after := listUDP(t)
	t.Logf("conntrack -L -p udp after:\n%s", sandboxtest.Run(t, "conntrack", "-L", "-p", "udp"))
	if _, ok := findByDst(after, svc53); ok {
		t.Fatalf("entry for %s survived DeleteUDP", svc53)
	}
	for _, dst := range []netip.AddrPort{svc54, direct} {
		if _, ok := findByDst(after, dst); !ok {
			t.Fatalf("unrelated entry for %s was deleted", dst)
		}
	}

	// Node-port form: any destination on port 54 replied by the pod.
	want = countByDst(after, svc54)
	got, err = n.DeleteUDP([]Flow{{NodePort: true, Port: 54, Backend: podIP}})
	if err != nil || got != want {
		t.Fatalf("DeleteUDP(nodePort 54 → %s) = %d, %v; want %d, nil", podIP, got, err, want)
	}
	after = listUDP(t)
	if _, ok := findByDst(after, svc54); ok {
		t.Fatalf("entry for %s survived the node-port DeleteUDP", svc54)
	}
	if _, ok := findByDst(after, direct); !ok {
		t.Fatalf("unrelated entry for %s was deleted", direct)
	}

	// The next datagram to the service gets a fresh entry and an answer.
	exchange(t, svc53)
	if _, ok := findByDst(listUDP(t), svc53); !ok {
		t.Fatalf("no new entry for %s after the delete", svc53)
	}
}

func TestSandboxDeleteUDPNothingToDo(t *testing.T) {
	sandboxtest.RequireRoot(t)
	n, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if got, err := n.DeleteUDP(nil); err != nil || got != 0 {
		t.Fatalf("DeleteUDP(nil) = %d, %v", got, err)
	}
	if got, err := n.DeleteUDP([]Flow{{Destination: netip.MustParseAddr("fd00::20"), Port: 53}}); err != nil || got != 0 {
		t.Fatalf("DeleteUDP(v6 nothing) = %d, %v", got, err)
	}
}

// TestSandboxMissingModule unloads nf_conntrack_netlink with on-demand
// loading disabled, then puts both back.
func TestSandboxMissingModule(t *testing.T) {
	sandboxtest.RequireRoot(t)
	const helper = "/proc/sys/kernel/modprobe"
	saved, err := os.ReadFile(helper)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(helper, []byte("/bin/false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.WriteFile(helper, saved, 0o644)
		if out, err := exec.Command(strings.TrimSpace(string(saved)), "nf_conntrack_netlink").CombinedOutput(); err != nil {
			t.Errorf("reload nf_conntrack_netlink: %v\n%s", err, out)
		}
	})
	sandboxtest.Run(t, "rmmod", "nf_conntrack_netlink")
	n, err := New()
	t.Logf("error: %v", err)
	if err == nil {
		n.Close()
		t.Fatal("New succeeded without nf_conntrack_netlink")
	}
	if !strings.Contains(err.Error(), "nf_conntrack_netlink") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("err = %v, want one line naming nf_conntrack_netlink", err)
	}
}
