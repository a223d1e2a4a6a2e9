//go:build sandbox

package iptables

import (
	"net"
	"os/exec"
	"strings"
	"testing"

	"github.com/ipvsproxy/ipvsproxy/internal/sandboxtest"
)

// TestSandboxIPVSFilterRealTraffic sends real TCP connections from a
// client namespace to an address on kube-ipvs0: the service port is
// reached, another port with a host process listening on it is refused
// by KUBE-IPVS-FILTER, and reached again once Cleanup removed the rules
// (so the refusal was ours, not the host's).
func TestSandboxIPVSFilterRealTraffic(t *testing.T) {
	createSets(t, IPv4)
	const vip = "10.96.0.10"
	sandboxtest.Run(t, "ip", "link", "add", "kube-ipvs0", "type", "dummy")
	sandboxtest.Run(t, "ip", "addr", "add", vip+"/32", "dev", "kube-ipvs0")
	sandboxtest.Run(t, "ip", "netns", "add", "client")
	sandboxtest.Run(t, "ip", "link", "add", "vcl0", "type", "veth", "peer", "name", "vcl1", "netns", "client")
	sandboxtest.Run(t, "ip", "addr", "add", "192.168.77.1/24", "dev", "vcl0")
	sandboxtest.Run(t, "ip", "link", "set", "vcl0", "up")
	for _, args := range [][]string{
		{"ip", "addr", "add", "192.168.77.2/24", "dev", "vcl1"},
		{"ip", "link", "set", "vcl1", "up"},
		{"ip", "link", "set", "lo", "up"},
		{"ip", "route", "add", "10.96.0.0/16", "via", "192.168.77.1"},
	} {
		sandboxtest.Run(t, "ip", append([]string{"netns", "exec", "client"}, args...)...)
	}
	defer func() {
		_ = exec.Command("ip", "netns", "del", "client").Run()
		_ = exec.Command("ip", "link", "del", "kube-ipvs0").Run()
		_ = exec.Command("ip", "link", "del", "vcl0").Run()
		_ = exec.Command("ipset", "flush", SetIPVSIPs).Run()
		_ = exec.Command("ipset", "flush", SetClusterIP).Run()
	}()
	sandboxtest.Run(t, "ipset", "add", SetIPVSIPs, vip)
	sandboxtest.Run(t, "ipset", "add", SetClusterIP, vip+",tcp:80")

	// Host processes listening on every address: the service port (no
	// IPVS virtual server here, so the host answers it) and a host port.
	for _, port := range []string{"80", "8080"} {
		l, err := net.Listen("tcp4", "0.0.0.0:"+port)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = l.Close() }()
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				_ = c.Close()
			}
		}()
	}

	s := mustSyncer(t, sandboxRunner(t, IPv4), DefaultConfig(IPv4))
	if _, err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := dialFromClient(vip, "80"); err != nil {
		t.Errorf("service port %s:80: %v; want it reached", vip, err)
	}
	if err := dialFromClient(vip, "8080"); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("host port %s:8080: %v; want the connection refused by KUBE-IPVS-FILTER", vip, err)
	}
	if err := s.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if err := dialFromClient(vip, "8080"); err != nil {
		t.Errorf("host port %s:8080 without our rules: %v; want it reached", vip, err)
	}
}

// dialFromClient opens (and closes) a TCP connection from the client
// namespace, using bash's /dev/tcp so no helper binary is needed.
func dialFromClient(ip, port string) error {
	out, err := exec.Command("ip", "netns", "exec", "client", "timeout", "5",
		"bash", "-c", "exec 3<>/dev/tcp/"+ip+"/"+port).CombinedOutput()
	if err != nil {
		return &dialError{strings.TrimSpace(string(out)) + ": " + err.Error()}
	}
	return nil
}

type dialError struct{ msg string }

func (e *dialError) Error() string { return e.msg }
