//go:build e2e

package framework

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"sync"
)

// The masquerading tests need to know which source address a backend saw
// (the pods' /peer answer), to send requests from inside a pod, and a pod
// network of a kind the sandbox's routed veths are not: a Linux bridge
// (for --detect-local-mode=BridgeInterface).

// Peer is a backend's answer to GET /peer: which pod answered, and the
// source address of the connection as that pod saw it.
type Peer struct {
	Pod, Addr string
}

func (p Peer) String() string { return p.Pod + " saw " + p.Addr }

func parsePeer(body string) (Peer, error) {
	f := strings.Fields(body)
	if len(f) != 2 || net.ParseIP(f[1]) == nil {
		return Peer{}, fmt.Errorf("not a /peer answer: %q", body)
	}
	return Peer{Pod: f[0], Addr: f[1]}, nil
}

// AskPeer is PeerTCP from somewhere: the root namespace, a Client or a Pod.
type AskPeer func(ip string, port int) (Peer, error)

// PeerTCP sends GET /peer to ip:port from the node (root namespace).
func PeerTCP(ip string, port int) (Peer, error) {
	resp, err := httpClient.Get(peerURL(ip, port))
	if err != nil {
		return Peer{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return Peer{}, err
	}
	if resp.StatusCode != http.StatusOK {
		return Peer{}, fmt.Errorf("HTTP %d: %s", resp.StatusCode, body)
	}
	return parsePeer(string(body))
}

// PeerTCP sends GET /peer to ip:port from inside the client's namespace.
func (c *Client) PeerTCP(ip string, port int) (Peer, error) {
	return peerFrom(c.netns, ip, port)
}

// PeerTCP sends GET /peer to ip:port from inside the pod's namespace: the
// pod as a client of a service.
func (p *Pod) PeerTCP(ip string, port int) (Peer, error) {
	return peerFrom(p.netns, ip, port)
}

func peerURL(ip string, port int) string {
	return "http://" + net.JoinHostPort(ip, strconv.Itoa(port)) + "/peer"
}

// peerFrom runs curl in netns (a fresh connection, 2 s to connect, 3 s in
// all), as Client.GetTCP does.
func peerFrom(netns, ip string, port int) (Peer, error) {
	url := peerURL(ip, port)
	out, err := exec.Command("ip", "netns", "exec", netns,
		"curl", "-sS", "--connect-timeout", "2", "-m", "3", "-f", url).CombinedOutput()
	if err != nil {
		return Peer{}, fmt.Errorf("from %s: curl %s: %v: %s", netns, url, err, strings.TrimSpace(string(out)))
	}
	return parsePeer(string(out))
}

// NodeAddrs lists the addresses of the node (root namespace) except those
// on skipLink (kube-ipvs0: service addresses, never a source the kernel
// picks for masquerading).
func NodeAddrs(skipLink string) (map[string]bool, error) {
	out, err := Run("ip", "-o", "addr", "show")
	if err != nil {
		return nil, err
	}
	addrs := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || strings.SplitN(f[1], "@", 2)[0] == skipLink || (f[2] != "inet" && f[2] != "inet6") {
			continue
		}
		addrs[strings.SplitN(f[3], "/", 2)[0]] = true
	}
	return addrs, nil
}

// A Bridge is a Linux bridge in the root namespace carrying a gateway
// address, with clients attached by veth ports: the layout of a
// bridge-based pod network (cbr0, docker0, cni0). Packets from its
// clients enter the node's IP stack with the bridge as input interface.
type Bridge struct {
	Name    string
	Gateway string // address of the bridge, the clients' default gateway
	bits    int

	mu   sync.Mutex
	next int // port sequence
}

// StartBridge creates bridge name with gatewayCIDR (e.g. "10.30.0.1/24")
// on it. The kernel loads the bridge module on demand.
func StartBridge(name, gatewayCIDR string) (*Bridge, error) {
	ip, ipnet, err := net.ParseCIDR(gatewayCIDR)
	if err != nil {
		return nil, err
	}
	bits, _ := ipnet.Mask.Size()
	b := &Bridge{Name: name, Gateway: ip.String(), bits: bits}
	for _, s := range [][]string{
		{"link", "add", name, "type", "bridge"},
		{"addr", "add", gatewayCIDR, "dev", name},
		{"link", "set", name, "up"},
	} {
		if _, err := Run("ip", s...); err != nil {
			b.Stop()
			return nil, fmt.Errorf("bridge %s: %w", name, err)
		}
	}
	return b, nil
}

// Stop removes the bridge (its ports go with their clients).
func (b *Bridge) Stop() { _, _ = Run("ip", "link", "del", b.Name) }

// StartClient attaches a client namespace with address ip (in the
// bridge's subnet) through a veth port of the bridge. The result is a
// Client: same requests, same Stop.
func (b *Bridge) StartClient(name, ip string) (*Client, error) {
	b.mu.Lock()
	b.next++
	c := &Client{Name: name, IP: ip, netns: "client-" + name, hostIf: fmt.Sprintf("%sp%d", b.Name, b.next)}
	b.mu.Unlock()
	if len(c.hostIf) > 15 {
		return nil, fmt.Errorf("bridge port name %q is longer than 15 bytes", c.hostIf)
	}
	in := func(args ...string) []string { return append([]string{"-n", c.netns}, args...) }
	steps := [][]string{
		{"netns", "add", c.netns},
		{"link", "add", c.hostIf, "type", "veth", "peer", "name", "eth0", "netns", c.netns},
		{"link", "set", c.hostIf, "master", b.Name},
		{"link", "set", c.hostIf, "up"},
		in("link", "set", "lo", "up"),
		in("addr", "add", fmt.Sprintf("%s/%d", ip, b.bits), "dev", "eth0"),
		in("link", "set", "eth0", "up"),
		in("route", "add", "default", "via", b.Gateway, "dev", "eth0"),
	}
	for _, s := range steps {
		if _, err := Run("ip", s...); err != nil {
			c.Stop()
			return nil, fmt.Errorf("bridged client %s: %w", name, err)
		}
	}
	return c, nil
}
