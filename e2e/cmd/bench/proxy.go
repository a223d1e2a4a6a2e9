//go:build e2e

package main

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// proxySpec is one proxy under test: how to start it and how to clean the
// node of everything it (or the other one) made.
type proxySpec struct {
	name    string
	path    string
	args    []string
	cleanup []string // arguments of `path` that clean the node
}

// specs builds both proxies' command lines with the same settings where
// they share a meaning: the node, the pod CIDR, NodePorts only on the
// node's own /24, conntrack sysctls left alone (not what is measured),
// health and metrics on loopback, pprof on (heap profiles are kept).
// Sync periods are each proxy's defaults
// (both 30 s; the minimum is 1 s for kube-proxy, 0 for ipvsproxy).
func specs(ipvsproxy, kubeProxy, kubeconfig, node string) []proxySpec {
	common := []string{
		"--kubeconfig", kubeconfig,
		"--hostname-override", node,
		"--cluster-cidr", "10.128.0.0/12",
		"--nodeport-addresses", "10.10.0.0/24",
		"--conntrack-max-per-core", "0",
		"--healthz-bind-address", "127.0.0.1:10256",
		"--metrics-bind-address", "127.0.0.1:10249",
		"--profiling",
		"-v", "2",
	}
	var out []proxySpec
	if ipvsproxy != "" {
		out = append(out, proxySpec{
			name: "ipvsproxy", path: ipvsproxy,
			args:    append([]string{"--iptables-backend", "legacy"}, common...),
			cleanup: []string{"cleanup", "--iptables-backend", "legacy"},
		})
	}
	if kubeProxy != "" {
		out = append(out, proxySpec{
			name: "kube-proxy", path: kubeProxy,
			args:    append([]string{"--proxy-mode=ipvs"}, common...),
			cleanup: []string{"--cleanup", "--proxy-mode=ipvs"},
		})
	}
	return out
}

// cleanNode removes what either proxy made, then flushes IPVS (this runs
// only inside the sandbox), and checks that no virtual server is left.
func cleanNode(all []proxySpec, logf func(string, ...any)) error {
	for _, p := range all {
		out, err := exec.Command(p.path, p.cleanup...).CombinedOutput()
		if err != nil {
			logf("cleanup with %s: %v: %s", p.name, err, lastLines(string(out), 5))
		}
	}
	if out, err := exec.Command("ipvsadm", "-C").CombinedOutput(); err != nil {
		return fmt.Errorf("ipvsadm -C: %v: %s", err, out)
	}
	t, err := readIPVS()
	if err != nil {
		return err
	}
	if len(t) != 0 {
		return fmt.Errorf("%d virtual servers left after cleanup", len(t))
	}
	return nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// running is a started proxy.
type running struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

func start(p proxySpec, logPath string) (*running, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	fmt.Fprintf(log, "\n===== bench: starting %s %s at %s\n", p.path, strings.Join(p.args, " "), time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", p.name, err)
	}
	r := &running{cmd: cmd, done: make(chan struct{})}
	go func() { r.err = cmd.Wait(); close(r.done) }()
	return r, nil
}

// exited returns the exit error once the process has ended, else nil.
func (r *running) exited() error {
	select {
	case <-r.done:
		if r.err == nil {
			return fmt.Errorf("exited with status 0")
		}
		return r.err
	default:
		return nil
	}
}

// stop sends SIGTERM, then SIGKILL after 30 s.
func (r *running) stop() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// usage is what the process consumed so far.
type usage struct {
	cpu, cpuChildren float64 // seconds: its own utime+stime; plus its waited-for children's
	hwmKB            int     // peak resident set (VmHWM), the process alone
}

const clockTicks = 100 // USER_HZ on Linux

func (r *running) usage() (usage, error) {
	pid := r.cmd.Process.Pid
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return usage{}, err
	}
	// Fields after the command name (which may hold spaces) start at state.
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 15 {
		return usage{}, fmt.Errorf("short /proc/%d/stat", pid)
	}
	tick := func(i int) float64 { v, _ := strconv.ParseFloat(f[i], 64); return v / clockTicks }
	// utime, stime, cutime, cstime are fields 14–17 of stat: 11–14 here.
	u := usage{cpu: tick(11) + tick(12)}
	u.cpuChildren = u.cpu + tick(13) + tick(14)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			u.hwmKB, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return u, nil
}
