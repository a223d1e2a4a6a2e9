//go:build e2e

package framework

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// A Pod is a network namespace joined to the sandbox's root namespace by a
// veth pair, running our backend, which answers with the pod's name.
//
// Addressing is /32 on both ends: the pod's default route goes to the
// link-local 169.254.1.1, which every root-side veth carries as a /32 (the
// sandbox has no default route for proxy ARP to use, as Calico does), and
// the root namespace routes each pod IP to its veth. With no connected
// subnet there is no network or broadcast address, so the kernel accepts
// any pod IP as an IPVS real server. IPv6 is the same picture: /128s and
// fe80::1 as the gateway on every root-side veth.
type Pod struct {
	Name     string
	IP       string // IPv4
	IP6      string // IPv6, empty for a single-stack pod
	TCPPorts []int
	UDPPorts []int

	netns, hostIf string
	cmd           *exec.Cmd
	done          chan struct{}
}

const (
	podGateway  = "169.254.1.1"
	podGateway6 = "fe80::1"
)

var (
	podMu   sync.Mutex
	podNext = 2 // next host number in 10.244.0.0/16; .0/.1 kept clear
	podSeq  int
)

// NextPodIP hands out addresses from the cluster CIDR 10.244.0.0/16,
// skipping .0 and .255 of every /24 so no address ever looks like a
// network or broadcast address.
func NextPodIP() string {
	podMu.Lock()
	defer podMu.Unlock()
	for podNext%256 == 0 || podNext%256 == 255 {
		podNext++
	}
	n := podNext
	podNext++
	return fmt.Sprintf("10.244.%d.%d", n/256, n%256)
}

// PodIP6 is the IPv6 twin of a pod IPv4 address from NextPodIP:
// 10.244.X.Y -> fd00:10:244::X:Y, so a dual-stack pod's addresses read alike.
func PodIP6(ip4 string) string {
	b := net.ParseIP(ip4).To4()
	// Via ParseIP: the API server accepts only the canonical spelling.
	return net.ParseIP(fmt.Sprintf("fd00:10:244::%x:%x", b[2], b[3])).String()
}

// StartPod creates the namespace, the veth pair and the routes, starts the
// backend (binary from E2E_CTL) inside, and waits until it accepts on its
// TCP ports. logDir receives the backend's output.
func StartPod(name, ip string, tcpPorts, udpPorts []int, logDir string) (*Pod, error) {
	return StartDualStackPod(name, ip, "", tcpPorts, udpPorts, logDir)
}

// StartDualStackPod is StartPod with an IPv6 address too (ip6 may be empty).
func StartDualStackPod(name, ip, ip6 string, tcpPorts, udpPorts []int, logDir string) (*Pod, error) {
	podMu.Lock()
	podSeq++
	p := &Pod{Name: name, IP: ip, IP6: ip6, TCPPorts: tcpPorts, UDPPorts: udpPorts,
		netns: "pod-" + name, hostIf: fmt.Sprintf("vp%d", podSeq)}
	podMu.Unlock()
	if err := p.plumb(); err != nil {
		p.unplumb()
		return nil, fmt.Errorf("pod %s: %w", name, err)
	}
	if err := p.startBackend(logDir); err != nil {
		p.unplumb()
		return nil, fmt.Errorf("pod %s: %w", name, err)
	}
	return p, nil
}

func (p *Pod) plumb() error {
	in := func(args ...string) []string { return append([]string{"-n", p.netns}, args...) }
	steps := [][]string{
		{"netns", "add", p.netns},
		{"link", "add", p.hostIf, "type", "veth", "peer", "name", "eth0", "netns", p.netns},
		in("link", "set", "lo", "up"),
		in("link", "set", "eth0", "up"),
		in("addr", "add", p.IP+"/32", "dev", "eth0"),
		in("route", "add", podGateway, "dev", "eth0", "scope", "link"),
		in("route", "add", "default", "via", podGateway, "dev", "eth0"),
		{"addr", "add", podGateway + "/32", "dev", p.hostIf},
		{"link", "set", p.hostIf, "up"},
		{"route", "add", p.IP + "/32", "dev", p.hostIf},
	}
	if p.IP6 != "" {
		// nodad: the addresses are usable at once, not after duplicate
		// address detection (a second or more).
		steps = append(steps,
			in("-6", "addr", "add", p.IP6+"/128", "dev", "eth0", "nodad"),
			in("-6", "route", "add", "default", "via", podGateway6, "dev", "eth0"),
			[]string{"-6", "addr", "add", podGateway6 + "/64", "dev", p.hostIf, "nodad"},
			[]string{"-6", "route", "add", p.IP6 + "/128", "dev", p.hostIf},
		)
	}
	for _, s := range steps {
		if _, err := Run("ip", s...); err != nil {
			return err
		}
	}
	return nil
}

// PodStartTimeout is how long a pod's backend may take to answer after
// it was started.
const PodStartTimeout = 60 * time.Second

func (p *Pod) unplumb() {
	_, _ = Run("ip", "link", "del", p.hostIf)
	_, _ = Run("ip", "netns", "del", p.netns)
}

func (p *Pod) startBackend(logDir string) error {
	ctl := os.Getenv("E2E_CTL")
	if ctl == "" {
		return fmt.Errorf("E2E_CTL (path of the e2ectl binary, the pods' backend) is not set")
	}
	args := []string{"netns", "exec", p.netns, ctl, "backend", "--name", p.Name,
		"--tcp", joinInts(p.TCPPorts), "--udp", joinInts(p.UDPPorts)}
	cmd := exec.Command("ip", args...)
	if logDir != "" {
		f, err := os.Create(filepath.Join(logDir, "pod-"+p.Name+".log"))
		if err != nil {
			return err
		}
		defer f.Close() // the child keeps its own descriptor
		cmd.Stdout, cmd.Stderr = f, f
	}
	// Own process group: a pod outlives the command that made it (the demo).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	p.cmd, p.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p.waitListening()
}

// waitListening polls the backend's ports from the root namespace — TCP
// by connecting, UDP by asking and waiting for the answer — which also
// proves the veth and routes work before any test relies on them. A
// datagram sent before the backend has bound its port is refused, so a
// UDP-only pod must be asked too, not just given time.
//
// The bound is long because a pod's first start reads e2ectl through the
// guest's hostfs while the host may be busy: seconds, not milliseconds.
func (p *Pod) waitListening() error {
	return Eventually(PodStartTimeout, 100*time.Millisecond, func() error {
		select {
		case <-p.done:
			return Permanent(fmt.Errorf("backend exited"))
		default:
		}
		for _, ip := range []string{p.IP, p.IP6} {
			if ip == "" {
				continue
			}
			for _, port := range p.TCPPorts {
				c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(port)), time.Second)
				if err != nil {
					return err
				}
				c.Close()
			}
			for _, port := range p.UDPPorts {
				if _, err := AskUDP(ip, port); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// Stop kills the backend and removes the namespace and veth.
func (p *Pod) Stop() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
		}
	}
	p.unplumb()
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
