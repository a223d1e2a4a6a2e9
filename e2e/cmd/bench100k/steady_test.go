//go:build e2e

package main

import (
	"strings"
	"testing"
	"time"
)

// The steady interval is the CPU and the passes between two marks, as a
// share of one CPU; an interval whose start was not measured says so
// instead of counting from zero.
func TestSteadyCPU(t *testing.T) {
	at := time.Date(2026, 12, 4, 18, 0, 0, 0, time.UTC)
	from := steadyMark{at: at, cpu: 17, passes: 1}
	to := steadyMark{at: at.Add(80 * time.Second), cpu: 37, passes: 5}
	s := from.until(to)
	if s.CPUSeconds != 20 || s.WallSeconds != 80 || s.FullPasses != 4 {
		t.Fatalf("until: %+v; want 20 CPU s over 80 s, 4 passes", s)
	}
	if got := s.String(); !strings.HasPrefix(got, "20.0 CPU s over 80 s: 25 % of one CPU (4 full passes") {
		t.Errorf("cell: %q", got)
	}
	if got := (steadyMark{}).until(to); got != (steadyCPU{}) || got.String() != "not measured" {
		t.Errorf("unmeasured start: %+v %q", got, got.String())
	}
	r := &report{Steady: s}
	if md := r.markdown(); !strings.Contains(md, "| proxy CPU on the programmed node: complete → last timed full pass | 20.0 CPU s over 80 s: 25 %") {
		t.Errorf("summary lacks the steady row:\n%s", md)
	}
}
