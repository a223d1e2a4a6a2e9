//go:build e2e

package main

import (
	"strings"
	"testing"
	"time"
)

// The ratio is start → kernel complete over the floor's sum, with the
// read before as its lower bound; the target line says met, MISSED or
// undecided, and the run's summary carries the floor's table.
func TestFloorReport(t *testing.T) {
	phases := []floorPhase{
		{Name: "addresses on kube-ipvs0", Objects: 100, Messages: 100, Seconds: 1},
		{Name: "set entries", Objects: 200, Sets: 34, Messages: 35, Seconds: 1},
		{Name: "virtual servers", Objects: 102, Messages: 102, Seconds: 0.5},
		{Name: "real servers", Objects: 1020, Messages: 1020, Seconds: 7.5},
	}
	for _, c := range []struct {
		seconds, prev float64
		ratio, low    float64
		verdict       string
	}{
		{seconds: 18, prev: 12, ratio: 1.8, low: 1.2, verdict: "met"},
		{seconds: 30, prev: 21, ratio: 3, low: 2.1, verdict: "MISSED"},
		{seconds: 30, prev: 15, ratio: 3, low: 1.5, verdict: "undecided"},
		{seconds: 30, prev: -1, ratio: 3, low: 0, verdict: "undecided"},
	} {
		r := &report{Programmed: programmed{Seconds: c.seconds, PrevReadSeconds: c.prev}}
		r.Floor.Phases = phases
		r.Floor.finish(r.Programmed, -1)
		f := r.Floor
		if f.Seconds != 10 || f.Objects != 1422 || f.PerSecond != 142.2 {
			t.Errorf("sum: %.1f s, %d objects, %.1f/s; want 10 s, 1422, 142.2/s", f.Seconds, f.Objects, f.PerSecond)
		}
		if f.Ratio != c.ratio || f.RatioLow != c.low || !strings.HasPrefix(f.verdict(), c.verdict) {
			t.Errorf("%.0f s (previous read %.0f s): ratio %.2f–%.2f %s; want %.2f–%.2f %s",
				c.seconds, c.prev, f.RatioLow, f.Ratio, f.verdict(), c.low, c.ratio, c.verdict)
		}
		md := r.markdown()
		for _, want := range []string{
			"| real servers | 1020 | 1020 | 7.5 | 136 | 0 |",
			"| set entries (34 sets created first) | 200 | 35 | 1.0 | 200 | 0 |",
			"| total | 1422 | | 10.0 | 142 | |",
			"| start → kernel complete within 2× the floor | target ≤ 2× " + c.verdict,
		} {
			if !strings.Contains(md, want) {
				t.Errorf("summary lacks %q:\n%s", want, md)
			}
		}
	}
}

func TestFloorReportNotMeasured(t *testing.T) {
	for _, c := range []struct {
		f    floorReport
		want string
	}{
		{floorReport{}, "not measured: the run ended before the proxy was stopped"},
		{floorReport{Skipped: "the kernel was never complete"}, "not measured: the kernel was never complete"},
		{floorReport{Error: "capture: boom"}, "not measured: capture: boom"},
	} {
		r := &report{Floor: c.f}
		if md := r.markdown(); !strings.Contains(md, "Floor (issue 20): "+c.want+"\n") {
			t.Errorf("want %q in:\n%s", c.want, md)
		}
	}
}

// Without a complete kernel there is nothing to capture and no ratio:
// the floor is skipped, not failed; a failed capture fails the floor.
func TestFloorSkippedOrFailed(t *testing.T) {
	r := &report{Programmed: programmed{Seconds: 0}}
	if o := captureForFloor(r); o != nil || r.Floor.Skipped == "" {
		t.Errorf("incomplete kernel: captured %v, skipped %q", o, r.Floor.Skipped)
	}
	if err := measureFloor(nil, time.Now(), r); err != nil {
		t.Errorf("skipped floor: %v", err)
	}
	r.Floor = floorReport{Error: "capture: no IPVS"}
	if err := measureFloor(nil, time.Now(), r); err == nil || err.Error() != "capture: no IPVS" {
		t.Errorf("failed capture: %v", err)
	}
}

// The proxy's Ready over the floor counts only when no IPVS read begun
// after /readyz answered found the kernel incomplete.
func TestFloorReportReady(t *testing.T) {
	phases := []floorPhase{{Name: "real servers", Objects: 1000, Messages: 1000, Seconds: 2}}
	for _, c := range []struct {
		name  string
		ready float64
		prog  programmed
		ratio float64
		row   string
	}{
		{"confirmed, met", 3.6, programmed{Seconds: 16, PrevReadSeconds: -1, PrevReadBeganSeconds: -1}, 1.8,
			"| /readyz first 200 / floor (the proxy's claim, checked by the IPVS reads after it) | 1.80× (3.6 s / 2.0 s): target ≤ 2× met |"},
		{"confirmed, missed", 12.6, programmed{Seconds: 26.9, PrevReadSeconds: -1, PrevReadBeganSeconds: -1}, 6.3,
			"6.30× (12.6 s / 2.0 s): target ≤ 2× MISSED |"},
		{"too early", 3, programmed{Seconds: 30, PrevReadSeconds: 15, PrevReadBeganSeconds: 4}, 0,
			"| not confirmed: TOO EARLY: the IPVS read of 4.0–15.0 s, begun after it, found the kernel incomplete |"},
		{"never ready", -1, programmed{Seconds: 30, PrevReadSeconds: -1, PrevReadBeganSeconds: -1}, 0,
			"| not confirmed: never answered 200 |"},
	} {
		r := &report{Programmed: c.prog}
		r.Startup.ReadyzSeconds = c.ready
		r.Floor.Phases = phases
		r.Floor.finish(r.Programmed, c.ready)
		if r.Floor.ReadyRatio != c.ratio {
			t.Errorf("%s: ready ratio %.2f, want %.2f", c.name, r.Floor.ReadyRatio, c.ratio)
		}
		if md := r.markdown(); !strings.Contains(md, c.row) {
			t.Errorf("%s: summary lacks %q:\n%s", c.name, c.row, md)
		}
	}
}

// The receive floor sits beside the ratio: /readyz over both
// floors only when /readyz was confirmed and the receive floor measured.
func TestFloorReportReceive(t *testing.T) {
	phases := []floorPhase{{Name: "real servers", Objects: 1000, Messages: 1000, Seconds: 2}}
	confirmed := programmed{Seconds: 26.9, PrevReadSeconds: -1, PrevReadBeganSeconds: -1}
	for _, c := range []struct {
		name  string
		ready float64
		rf    receiveFloor
		ratio float64
		rows  []string
	}{
		{"measured", 9, receiveFloor{Seconds: 2.5, Services: 10002, Slices: 10002}, 2, []string{
			"every object decoded and dropped (s) | 2.5 (10002 services, 10002 slices) |",
			"| /readyz first 200 / (floor + receive floor) | 2.00× (9.0 s / 4.5 s) |"}},
		{"failed", 9, receiveFloor{Seconds: 1, Error: "endpointslices: the watch ended"}, 0, []string{
			"every object decoded and dropped (s) | not measured: endpointslices: the watch ended |"}},
		{"never ready", -1, receiveFloor{Seconds: 2.5, Services: 3, Slices: 3}, 0, []string{"| 2.5 (3 services, 3 slices) |"}},
	} {
		r := &report{Programmed: confirmed}
		r.Startup.ReadyzSeconds = c.ready
		r.Floor.Phases = phases
		r.Floor.finish(r.Programmed, c.ready)
		r.Floor.addReceive(c.rf, c.ready)
		if r.Floor.ReadyBothRatio != c.ratio {
			t.Errorf("%s: ratio %.2f, want %.2f", c.name, r.Floor.ReadyBothRatio, c.ratio)
		}
		md := r.markdown()
		for _, row := range c.rows {
			if !strings.Contains(md, row) {
				t.Errorf("%s: summary lacks %q:\n%s", c.name, row, md)
			}
		}
		if c.ratio == 0 && strings.Contains(md, "(floor + receive floor)") {
			t.Errorf("%s: a ratio to both floors without both:\n%s", c.name, md)
		}
	}
}
