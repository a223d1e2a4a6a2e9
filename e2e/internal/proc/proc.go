//go:build e2e

// Package proc runs a proxy under a benchmark (e2e/cmd/bench,
// e2e/cmd/bench100k) as a process of its own, its output appended to a
// log, and reads what it has consumed from /proc.
package proc

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Process is a started proxy.
type Process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// Start runs path with args, its output appended to logPath after a line
// "===== BANNER: starting PATH ARGS at TIME" that marks each start.
func Start(name, banner, path string, args []string, logPath string) (*Process, error) {
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	fmt.Fprintf(log, "\n===== %s: starting %s %s at %s\n", banner, path, strings.Join(args, " "), time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

// Exited returns why the process ended, nil while it runs.
func (p *Process) Exited() error {
	select {
	case <-p.done:
		if p.err == nil {
			return fmt.Errorf("%s exited with status 0", p.name)
		}
		return fmt.Errorf("%s exited: %w", p.name, p.err)
	default:
		return nil
	}
}

// Stop sends SIGTERM, then SIGKILL after grace.
func (p *Process) Stop(grace time.Duration) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Usage is what the process has consumed so far.
type Usage struct {
	CPUSeconds      float64 `json:"cpuSeconds"`             // its own utime+stime
	UserSeconds     float64 `json:"userSeconds"`            // utime alone
	SystemSeconds   float64 `json:"systemSeconds"`          // stime alone: the kernel's work for its system calls
	CPUWithChildren float64 `json:"cpuWithChildrenSeconds"` // plus its waited-for children's (iptables, ipset)
	RSSKB           int     `json:"rssKB"`                  // VmRSS now
	HWMKB           int     `json:"hwmKB"`                  // VmHWM: peak resident set, the process alone
}

const clockTicks = 100 // USER_HZ on Linux

// Usage reads /proc/PID/stat and /proc/PID/status.
func (p *Process) Usage() (Usage, error) {
	pid := p.cmd.Process.Pid
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Usage{}, err
	}
	// Fields after the command name (which may hold spaces) start at state.
	s := string(stat)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 15 {
		return Usage{}, fmt.Errorf("short /proc/%d/stat", pid)
	}
	tick := func(i int) float64 { v, _ := strconv.ParseFloat(f[i], 64); return v / clockTicks }
	// utime, stime, cutime, cstime are fields 14–17 of stat: 11–14 here.
	u := Usage{CPUSeconds: tick(11) + tick(12), UserSeconds: tick(11), SystemSeconds: tick(12)}
	u.CPUWithChildren = u.CPUSeconds + tick(13) + tick(14)
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		kb, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		switch k {
		case "VmHWM":
			u.HWMKB = kb
		case "VmRSS":
			u.RSSKB = kb
		}
	}
	return u, nil
}
