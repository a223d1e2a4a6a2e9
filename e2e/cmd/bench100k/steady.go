//go:build e2e

package main

import (
	"fmt"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/proc"
)

// steadyCPU is what the proxy costs a node it has programmed: its CPU
// from the kernel found complete to the last timed full pass, over the
// wall time between. The periodic full passes are most of it (a change
// costs the loop under a millisecond); their cost grows with the
// cluster, every sync period, on every node.
type steadyCPU struct {
	CPUSeconds  float64 `json:"cpuSeconds"`
	WallSeconds float64 `json:"wallSeconds"`
	FullPasses  int     `json:"fullPasses"` // ended in the interval
}

// steadyMark is one end of a steadyCPU interval.
type steadyMark struct {
	at     time.Time
	cpu    float64
	passes float64
}

// markSteady reads the proxy's CPU and, from its metrics m, the full
// passes ended so far.
func markSteady(proxy *proc.Process, m metrics) steadyMark {
	u, _ := proxy.Usage()
	return steadyMark{at: time.Now(), cpu: u.CPUSeconds, passes: passesDone(m)}
}

// until is the interval from from to to; nothing when from was not
// measured.
func (from steadyMark) until(to steadyMark) steadyCPU {
	if from.at.IsZero() {
		return steadyCPU{}
	}
	return steadyCPU{
		CPUSeconds:  to.cpu - from.cpu,
		WallSeconds: to.at.Sub(from.at).Seconds(),
		FullPasses:  int(to.passes - from.passes),
	}
}

// String is the summary's cell: the CPU, the share of one CPU, the passes.
func (s steadyCPU) String() string {
	if s.WallSeconds <= 0 {
		return "not measured"
	}
	return fmt.Sprintf("%.1f CPU s over %.0f s: %.0f %% of one CPU (%d full passes, and the changes written meanwhile)",
		s.CPUSeconds, s.WallSeconds, 100*s.CPUSeconds/s.WallSeconds, s.FullPasses)
}
