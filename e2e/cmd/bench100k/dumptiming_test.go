//go:build e2e

package main

import (
	"testing"
	"time"
)

// TestTimingOfADumpWhoseMessagesSlowDown: each tenth's time, in dump
// order, and the longest wait.
func TestTimingOfADumpWhoseMessagesSlowDown(t *testing.T) {
	gaps := make([]time.Duration, 100)
	for i := range gaps {
		gaps[i] = time.Millisecond
		if i%10 == 0 { // a message of 10 services, each slower to fill
			gaps[i] = time.Duration(i+1) * 10 * time.Millisecond
		}
	}
	d := timingOf(gaps, 3*time.Second)
	if d.Services != 100 || d.Seconds != 3 || d.LongestMs != 910 {
		t.Errorf("timing %+v", d)
	}
	want := "100 virtual servers in 3.0s; each tenth of them in turn (s): 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9; the longest wait between two: 910.0 ms"
	if got := d.String(); got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

// TestTimingOfAFewServices: fewer than ten services leave tenths empty.
func TestTimingOfAFewServices(t *testing.T) {
	d := timingOf([]time.Duration{2 * time.Millisecond, 7 * time.Millisecond, time.Millisecond}, time.Second)
	if d.Tenths != [10]float64{0.002, 0, 0, 0.007, 0, 0, 0.001} || d.LongestMs != 7 {
		t.Errorf("timing %+v", d)
	}
}

// TestTimingOfNoServices: an empty dump is no division by zero.
func TestTimingOfNoServices(t *testing.T) {
	if d := timingOf(nil, time.Millisecond); d.Services != 0 || d.Tenths != [10]float64{} {
		t.Errorf("timing %+v", d)
	}
}
