//go:build e2e

package main

import (
	"testing"
	"time"
)

// TestReadGate: the expensive IPVS read waits for /readyz, or — for a
// proxy that never answers 200 — until the sets have been full for as
// long as they took to fill, and at least a minute.
func TestReadGate(t *testing.T) {
	ready := func(r bool) func() bool { return func() bool { return r } }
	ago := func(s float64) time.Time { return time.Now().Add(-time.Duration(s * float64(time.Second))) }
	for _, c := range []struct {
		name          string
		ready         bool
		since, setsAt float64 // seconds since begin; when the sets were full
		want          bool
	}{
		{"ready", true, 50, 40, true},
		{"not ready, sets just full", false, 50, 40, false},
		{"not ready, a minute after sets full at 10 s", false, 71, 10, true},
		{"not ready, under a minute after", false, 69, 10, false},
		{"not ready, sets took 300 s, full 200 s ago", false, 500, 300, false},
		{"not ready, sets took 300 s, full 301 s ago", false, 601, 300, true},
	} {
		if got := readGate(ready(c.ready), ago(c.since), c.setsAt); got != c.want {
			t.Errorf("%s: readGate %v, want %v", c.name, got, c.want)
		}
	}
}
