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

// TestGuestCPUSplit: /proc/stat's cpu line is read in its ticks, nice
// with user and iowait with idle, the split since the launch is the
// difference of two readings, and it prints in seconds.
func TestGuestCPUSplit(t *testing.T) {
	launch, err := parseGuestCPU("cpu  100 50 300 1000 20 5 40 3 0 0\ncpu0 100 50 300 1000 20 5 40 3 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	now, err := parseGuestCPU("cpu  1100 50 2300 1500 20 5 140 3 0 0\n")
	if err != nil {
		t.Fatal(err)
	}
	want := guestCPU{User: 1000, System: 2000, Idle: 500, SoftIRQ: 100, Other: 0}
	if got := now.minus(launch); got != want {
		t.Errorf("split %+v, want %+v", got, want)
	}
	launch.Bench, now.Bench = time.Second, 3500*time.Millisecond
	s := cpuSplit{Seconds: 40, Guest: now.minus(launch)}
	s.Proxy.UserSeconds, s.Proxy.SystemSeconds = 7, 9.5
	s.Proxy.MinorFaults, s.Proxy.MajorFaults, s.Proxy.VoluntarySwitches, s.Proxy.InvoluntarySwitches = 25000, 3, 9000, 1000
	if got := s.String(); got != "40.0 s: guest user 10.0, system 20.0, softirq 1.0, other 0.0, idle 5.0; of it the proxy's user 7.0, system 9.5"+
		" (25003 page faults, 3 major; 10000 context switches, 1000 of them preempted), the benchmark's (fake API server, polls) 2.5" {
		t.Errorf("printed %q", got)
	}
	if _, err := parseGuestCPU("intr 1 2 3\n"); err == nil {
		t.Error("a /proc/stat without a cpu line parsed")
	}
}
