//go:build e2e

package framework

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"sync"
)

// A Client is a machine outside the cluster that reaches the node over a
// link: a network namespace with its own address (not in the cluster
// CIDR), routed to the root namespace like a pod (/32 on a veth, default
// route via 169.254.1.1). Its traffic arrives on the node from outside,
// as a load balancer's or a user's would, so it goes through PREROUTING
// and the filter table's INPUT rules (loadBalancerSourceRanges) rather
// than the host's OUTPUT path.
type Client struct {
	Name, IP      string
	netns, hostIf string
}

var (
	clientMu  sync.Mutex
	clientSeq int
)

// StartClient creates the client's namespace with address ip.
func StartClient(name, ip string) (*Client, error) {
	clientMu.Lock()
	clientSeq++
	c := &Client{Name: name, IP: ip, netns: "client-" + name, hostIf: fmt.Sprintf("vc%d", clientSeq)}
	clientMu.Unlock()
	in := func(args ...string) []string { return append([]string{"-n", c.netns}, args...) }
	steps := [][]string{
		{"netns", "add", c.netns},
		{"link", "add", c.hostIf, "type", "veth", "peer", "name", "eth0", "netns", c.netns},
		in("link", "set", "lo", "up"),
		in("link", "set", "eth0", "up"),
		in("addr", "add", ip+"/32", "dev", "eth0"),
		in("route", "add", podGateway, "dev", "eth0", "scope", "link"),
		in("route", "add", "default", "via", podGateway, "dev", "eth0"),
		{"addr", "add", podGateway + "/32", "dev", c.hostIf},
		{"link", "set", c.hostIf, "up"},
		{"route", "add", ip + "/32", "dev", c.hostIf},
	}
	for _, s := range steps {
		if _, err := Run("ip", s...); err != nil {
			c.Stop()
			return nil, fmt.Errorf("client %s: %w", name, err)
		}
	}
	return c, nil
}

// Stop removes the namespace and its link.
func (c *Client) Stop() {
	_, _ = Run("ip", "link", "del", c.hostIf)
	_, _ = Run("ip", "netns", "del", c.netns)
}

// GetTCP is framework.GetTCP from inside the client (curl, a fresh
// connection each time, 2 s to connect, 3 s in all): the name of the pod
// that answered.
func (c *Client) GetTCP(ip string, port int) (string, error) {
	url := "http://" + net.JoinHostPort(ip, strconv.Itoa(port)) + "/"
	out, err := exec.Command("ip", "netns", "exec", c.netns,
		"curl", "-sS", "--connect-timeout", "2", "-m", "3", "-w", "\n%{http_code}", url).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("from %s (%s): curl %s: %v: %s", c.Name, c.IP, url, err, strings.TrimSpace(string(out)))
	}
	s := strings.TrimSpace(string(out))
	i := strings.LastIndex(s, "\n")
	if i < 0 || s[i+1:] != "200" {
		return "", fmt.Errorf("from %s: %s: unexpected answer %q", c.Name, url, s)
	}
	return strings.TrimSpace(s[:i]), nil
}

// HealthCheckReply is the JSON body of a health-check node port
// (kube-proxy's format).
type HealthCheckReply struct {
	Service struct {
		Namespace string `json:"namespace"`
		Name      string `json:"name"`
	} `json:"service"`
	LocalEndpoints      int  `json:"localEndpoints"`
	ServiceProxyHealthy bool `json:"serviceProxyHealthy"`
}

// HealthCheck asks a health-check node port: HTTP status, decoded body.
func HealthCheck(ip string, port int) (int, HealthCheckReply, error) {
	var reply HealthCheckReply
	resp, err := httpClient.Get("http://" + net.JoinHostPort(ip, strconv.Itoa(port)) + "/")
	if err != nil {
		return 0, reply, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, reply, err
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return resp.StatusCode, reply, fmt.Errorf("content type %q, want application/json; body %q", ct, body)
	}
	if err := json.Unmarshal(body, &reply); err != nil {
		return resp.StatusCode, reply, fmt.Errorf("body %q: %v", body, err)
	}
	return resp.StatusCode, reply, nil
}

// Pid is the process id of the running ipvsproxy (0 when not running).
func (p *Proxy) Pid() int {
	if !p.Running() {
		return 0
	}
	return p.cmd.Process.Pid
}

// Flag is the value of --name on the proxy's command line, or def.
func (p *Proxy) Flag(name, def string) string {
	for i := 0; i+1 < len(p.Args); i++ {
		if p.Args[i] == "--"+name {
			return p.Args[i+1]
		}
	}
	return def
}
