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
// any pod IP as an IPVS real server.
type Pod struct {
	Name     string
	IP       string
	TCPPorts []int
	UDPPorts []int

	netns, hostIf string
	cmd           *exec.Cmd
	done          chan struct{}
}

const podGateway = "169.254.1.1"

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

// StartPod creates the namespace, the veth pair and the routes, starts the
// backend (binary from E2E_CTL) inside, and waits until it accepts on its
// TCP ports. logDir receives the backend's output.
func StartPod(name, ip string, tcpPorts, udpPorts []int, logDir string) (*Pod, error) {
	podMu.Lock()
	podSeq++
	p := &Pod{Name: name, IP: ip, TCPPorts: tcpPorts, UDPPorts: udpPorts,
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
	for _, s := range steps {
		if _, err := Run("ip", s...); err != nil {
			return err
		}
	}
	return nil
}

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

// waitListening polls the backend's TCP ports from the root namespace,
// which also proves the veth and routes work before any test relies on them.
func (p *Pod) waitListening() error {
	ports := p.TCPPorts
	if len(ports) == 0 {
		time.Sleep(200 * time.Millisecond) // UDP only: nothing to poll
		return nil
	}
	return Eventually(15*time.Second, 100*time.Millisecond, func() error {
		select {
		case <-p.done:
			return fmt.Errorf("backend exited")
		default:
		}
		for _, port := range ports {
			c, err := net.DialTimeout("tcp", net.JoinHostPort(p.IP, strconv.Itoa(port)), time.Second)
			if err != nil {
				return err
			}
			c.Close()
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
