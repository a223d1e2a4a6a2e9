//go:build e2e

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/proc"
)

// Where the guest's one CPU went from the proxy's launch until it was
// Ready: the proxy's own user and system time against the whole guest's
// (/proc/stat), so that a start-up slower than the proxy's CPU explains
// is traced to the kernel, the benchmark's fake API server, or idleness.

// guestCPU is the first ("cpu") line of /proc/stat, in its ticks
// (USER_HZ, 100 a second).
type guestCPU struct {
	User    int64 `json:"userTicks"` // user + nice
	System  int64 `json:"systemTicks"`
	Idle    int64 `json:"idleTicks"` // idle + iowait
	SoftIRQ int64 `json:"softirqTicks"`
	Other   int64 `json:"otherTicks"` // irq, steal
	// Bench is this benchmark's own CPU (the fake API server, the
	// polls), read at the same moment.
	Bench time.Duration `json:"benchCPU"`
}

// parseGuestCPU reads /proc/stat's text.
func parseGuestCPU(text string) (guestCPU, error) {
	line, _, _ := strings.Cut(text, "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return guestCPU{}, fmt.Errorf("/proc/stat: no cpu line in %q", line)
	}
	v := make([]int64, 8)
	for i := range v {
		n, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil {
			return guestCPU{}, fmt.Errorf("/proc/stat: %w", err)
		}
		v[i] = n
	}
	// user nice system idle iowait irq softirq steal
	return guestCPU{User: v[0] + v[1], System: v[2], Idle: v[3] + v[4], SoftIRQ: v[6], Other: v[5] + v[7]}, nil
}

func readGuestCPU() (guestCPU, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return guestCPU{}, err
	}
	g, err := parseGuestCPU(string(data))
	var ru syscall.Rusage
	if err == nil {
		err = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
		g.Bench = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return g, err
}

// guestCPUAtLaunch is the guest's CPU before the proxy's launch; nil
// (no split until ready is reported) when /proc/stat cannot be read.
func guestCPUAtLaunch() *guestCPU {
	g, err := readGuestCPU()
	if err != nil {
		logf("no CPU split until ready: %v", err)
		return nil
	}
	return &g
}

func (g guestCPU) minus(o guestCPU) guestCPU {
	return guestCPU{User: g.User - o.User, System: g.System - o.System, Idle: g.Idle - o.Idle,
		SoftIRQ: g.SoftIRQ - o.SoftIRQ, Other: g.Other - o.Other, Bench: g.Bench - o.Bench}
}

// cpuSplit is the CPU from the launch to when /readyz was first seen 200
// (by waitProgrammed's poll, every 2 s).
type cpuSplit struct {
	Seconds float64    `json:"seconds"` // the launch → seen ready
	Guest   guestCPU   `json:"guest"`   // the whole guest's, since the launch
	Proxy   proc.Usage `json:"proxy"`
}

func (s *cpuSplit) String() string {
	g := s.Guest
	sec := func(ticks int64) float64 { return float64(ticks) / 100 }
	p := s.Proxy
	return fmt.Sprintf("%.1f s: guest user %.1f, system %.1f, softirq %.1f, other %.1f, idle %.1f; of it the proxy's user %.1f, system %.1f"+
		" (%d page faults, %d major; %d context switches, %d of them preempted), the benchmark's (fake API server, polls) %.1f",
		s.Seconds, sec(g.User), sec(g.System), sec(g.SoftIRQ), sec(g.Other), sec(g.Idle), p.UserSeconds, p.SystemSeconds,
		p.MinorFaults+p.MajorFaults, p.MajorFaults, p.VoluntarySwitches+p.InvoluntarySwitches, p.InvoluntarySwitches, g.Bench.Seconds())
}
