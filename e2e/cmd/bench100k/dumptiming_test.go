//go:build e2e

package main

import (
	"testing"
	"time"
)

// TestTimingOfADumpWhoseMessagesSlowDown: the longest wait among the
// first and the last tenth of the services, the whole dump's time kept.
func TestTimingOfADumpWhoseMessagesSlowDown(t *testing.T) {
	gaps := make([]time.Duration, 100)
	for i := range gaps {
		gaps[i] = 5 * time.Microsecond
		if i%20 == 0 { // a message of 20 services, each slower to fill
			gaps[i] = time.Duration(i+1) * time.Millisecond
		}
	}
	gaps[95] = 200 * time.Millisecond
	d := timingOf(gaps, 3*time.Second)
	if d.Services != 100 || d.Seconds != 3 || d.FirstTenthMs != 1 || d.LastTenthMs != 200 {
		t.Errorf("timing %+v", d)
	}
	want := "100 virtual servers in 3.0s; the longest wait between two of them: 1.0 ms in the first tenth, 200.0 ms in the last"
	if got := d.String(); got != want {
		t.Errorf("%q, want %q", got, want)
	}
}

// TestTimingOfAFewServices: fewer than ten services are each tenth.
func TestTimingOfAFewServices(t *testing.T) {
	d := timingOf([]time.Duration{2 * time.Millisecond, 7 * time.Millisecond, time.Millisecond}, time.Second)
	if d.FirstTenthMs != 2 || d.LastTenthMs != 1 {
		t.Errorf("timing %+v, want the first and the last wait", d)
	}
}
