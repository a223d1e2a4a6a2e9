//go:build e2e

package framework

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/scrape"
)

// The reliability tests' toolbox: the API server as a process that can be
// stopped and started again, connection counters per real server, a TCP
// connection that lives across a rolling update, a UDP client pinned to
// one source port, conntrack listings and the nat rules.

// APIServer is the sandbox's kube-apiserver process, found by its binary
// (E2E_APISERVER, started by guest/cluster.sh).
type APIServer struct {
	Binary  string
	LogPath string
	argv    []string
	pid     int
	cmd     *exec.Cmd
	done    chan struct{}
}

// FindAPIServer finds the running kube-apiserver and remembers its command
// line, so Start runs it again with exactly the flags cluster.sh gave it.
func FindAPIServer(logPath string) (*APIServer, error) {
	bin, err := Env("E2E_APISERVER")
	if err != nil {
		return nil, err
	}
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return nil, err
	}
	for _, f := range dirs {
		raw, err := os.ReadFile(f)
		if err != nil || len(raw) == 0 {
			continue // exited meanwhile, or a kernel thread
		}
		argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if argv[0] != bin {
			continue
		}
		pid, _ := strconv.Atoi(strings.Split(f, "/")[2])
		return &APIServer{Binary: bin, LogPath: logPath, argv: argv, pid: pid}, nil
	}
	return nil, fmt.Errorf("no process running %s", bin)
}

// Stop kills the API server (SIGKILL: an outage does not wait for a
// graceful shutdown) and waits until the process is gone.
func (a *APIServer) Stop() error {
	if a.cmd != nil {
		_ = a.cmd.Process.Kill()
		<-a.done
		a.cmd = nil
		return nil
	}
	if err := syscall.Kill(a.pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill kube-apiserver %d: %w", a.pid, err)
	}
	// cluster.sh is its parent and reaps it; wait until /proc says so.
	return Eventually(10*time.Second, 50*time.Millisecond, func() error {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", a.pid))
		if err != nil {
			return nil
		}
		if f := strings.Fields(string(raw)); len(f) > 2 && f[2] == "Z" {
			return nil // a zombie serves nothing
		}
		return fmt.Errorf("kube-apiserver %d still running", a.pid)
	})
}

// Start runs the API server again with the same command line, appending
// to its log, and waits until /readyz answers ok through client.
func (a *APIServer) Start(client kubernetes.Interface) error {
	log, err := os.OpenFile(a.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer log.Close()
	fmt.Fprintf(log, "\n===== e2e: restarting kube-apiserver at %s\n", time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(a.argv[0], a.argv[1:]...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	a.cmd, a.done, a.pid = cmd, make(chan struct{}), cmd.Process.Pid
	go func() { _ = cmd.Wait(); close(a.done) }()
	return Eventually(120*time.Second, 250*time.Millisecond, func() error {
		select {
		case <-a.done:
			return Permanent(fmt.Errorf("kube-apiserver exited (log %s)", a.LogPath))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("readyz: %v: %s", err, body)
		}
		return nil
	})
}

// Conns are the connection counts of one real server as `ipvsadm -Ln`
// prints them.
type Conns struct {
	Weight, Active, Inactive int
}

// IPVSConns reads `ipvsadm -Ln`: per real server (key "TCP 10.96.0.10:80
// -> 10.244.0.2:8080") its weight and active/inactive connections.
func IPVSConns() (map[string]Conns, error) {
	out, err := Run("ipvsadm", "-Ln")
	if err != nil {
		return nil, err
	}
	conns := map[string]Conns{}
	var cur string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 2 && (f[0] == "TCP" || f[0] == "UDP" || f[0] == "SCTP"):
			cur = f[0] + " " + f[1]
		case len(f) == 6 && f[0] == "->" && cur != "":
			var n [3]int
			for i := range n {
				if n[i], err = strconv.Atoi(f[3+i]); err != nil {
					return nil, fmt.Errorf("ipvsadm -Ln line %q: %v", line, err)
				}
			}
			conns[cur+" -> "+f[1]] = Conns{Weight: n[0], Active: n[1], Inactive: n[2]}
		}
	}
	return conns, nil
}

// KeepAlive is one TCP connection carrying HTTP/1.1 requests one after
// the other: a client that opened its connection before a rolling update
// and keeps using it.
type KeepAlive struct {
	conn net.Conn
	rd   *bufio.Reader
}

// DialKeepAlive opens the connection.
func DialKeepAlive(ip string, port int) (*KeepAlive, error) {
	c, err := net.DialTimeout("tcp", net.JoinHostPort(ip, strconv.Itoa(port)), 3*time.Second)
	if err != nil {
		return nil, err
	}
	return &KeepAlive{conn: c, rd: bufio.NewReader(c)}, nil
}

// LocalAddr is the client side of the connection.
func (k *KeepAlive) LocalAddr() string { return k.conn.LocalAddr().String() }

// Get sends one request on the connection and returns the answering pod.
func (k *KeepAlive) Get() (string, error) {
	_ = k.conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(k.conn, "GET / HTTP/1.1\r\nHost: e2e\r\n\r\n"); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(k.rd, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK || resp.Close {
		return "", fmt.Errorf("HTTP %d (close %v): %s", resp.StatusCode, resp.Close, body)
	}
	return strings.TrimSpace(string(body)), nil
}

// Close ends the connection.
func (k *KeepAlive) Close() error { return k.conn.Close() }

// PinnedUDP sends datagrams from one fixed source port, so every datagram
// is the same conntrack (and IPVS) flow — the client a stale entry would
// keep sending to a backend that is gone.
type PinnedUDP struct {
	conn *net.UDPConn
}

// DialPinnedUDP binds srcPort and connects to ip:port.
func DialPinnedUDP(srcPort int, ip string, port int) (*PinnedUDP, error) {
	c, err := net.DialUDP("udp", &net.UDPAddr{Port: srcPort}, &net.UDPAddr{IP: net.ParseIP(ip), Port: port})
	if err != nil {
		return nil, err
	}
	return &PinnedUDP{conn: c}, nil
}

// Ask sends one datagram and returns the name in the reply.
func (u *PinnedUDP) Ask(timeout time.Duration) (string, error) {
	_ = u.conn.SetDeadline(time.Now().Add(timeout))
	if _, err := u.conn.Write([]byte("who\n")); err != nil {
		return "", err
	}
	buf := make([]byte, 512)
	n, err := u.conn.Read(buf)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(buf[:n])), nil
}

// Close releases the port.
func (u *PinnedUDP) Close() error { return u.conn.Close() }

// ConntrackUDP lists the conntrack entries of UDP flows to dst:port, as
// `conntrack -L` prints them (an empty list is not an error).
func ConntrackUDP(dst string, port int) ([]string, error) {
	out, err := exec.Command("conntrack", "-L", "-p", "udp", "--orig-dst", dst, "--orig-port-dst", strconv.Itoa(port)).Output()
	if err != nil {
		return nil, fmt.Errorf("conntrack -L: %v", err)
	}
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			lines = append(lines, l)
		}
	}
	return lines, sc.Err()
}

// IPTablesNatRules are the rules of the nat table (iptables-save -t nat,
// the iptables backend under test) that are ipvsproxy's: every "-A" line
// naming a KUBE- chain.
func IPTablesNatRules() ([]string, error) {
	out, err := Run("iptables-save", "-t", "nat")
	if err != nil {
		return nil, err
	}
	var rules []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "-A ") && strings.Contains(l, "KUBE-") {
			rules = append(rules, l)
		}
	}
	return rules, nil
}

// Healthz returns the HTTP status and body of url.
func Healthz(url string) (int, string, error) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(body)), nil
}

// MetricsURL is where the sandbox's ipvsproxy serves /metrics.
const MetricsURL = "http://127.0.0.1:10249/metrics"

// Metric returns the value of a series (a name, with its labels as
// /metrics prints them) from the proxy's /metrics (0 when it has not been
// exported yet).
func Metric(series string) (float64, error) {
	m, err := scrape.Scrape(MetricsURL)
	if err != nil {
		return 0, err
	}
	return m.Get(series), nil
}
