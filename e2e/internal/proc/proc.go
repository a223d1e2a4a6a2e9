//go:build e2e

// Package proc runs a proxy under a benchmark (e2e/cmd/bench,
// e2e/cmd/bench100k) as a process of its own, its output appended to a
// log, and reads what it has consumed from /proc.
package proc

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	// What the kernel did for it besides its system calls, each a trap
	// into the host under user-mode Linux: page faults (every thread's,
	// ended ones too) and context switches (the live threads').
	MinorFaults         int64 `json:"minorFaults"`
	MajorFaults         int64 `json:"majorFaults"`
	VoluntarySwitches   int64 `json:"voluntarySwitches"`   // it blocked: a wait, a sleep, a system call that waits
	InvoluntarySwitches int64 `json:"involuntarySwitches"` // it was preempted
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
	// minflt and majflt are fields 10 and 12: 7 and 9 here.
	u.MinorFaults, _ = strconv.ParseInt(f[7], 10, 64)
	u.MajorFaults, _ = strconv.ParseInt(f[9], 10, 64)
	u.VoluntarySwitches, u.InvoluntarySwitches = threadSwitches(pid)
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

// threadSwitches sums the context switches of pid's live threads: the
// process's own status file counts its first thread's alone.
func threadSwitches(pid int) (voluntary, involuntary int64) {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, path := range tasks {
		status, err := os.ReadFile(path)
		if err != nil {
			continue // the thread ended
		}
		for _, line := range strings.Split(string(status), "\n") {
			k, v, _ := strings.Cut(line, ":")
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			switch k {
			case "voluntary_ctxt_switches":
				voluntary += n
			case "nonvoluntary_ctxt_switches":
				involuntary += n
			}
		}
	}
	return voluntary, involuntary
}
