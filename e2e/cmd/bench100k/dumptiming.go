//go:build e2e

package main

import (
	"fmt"
	"time"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// dumpTiming is one dump of the kernel's virtual servers, timed between
// the services it handed over. Within one netlink message they come
// microseconds apart; between two, the kernel was filling the next
// message. IPVS fills each message by walking its service table from the
// first entry to where the last message ended (ip_vs_genl_dump_services),
// so that wait grows along the dump, and this guest's kernel does not
// preempt (CONFIG_PREEMPT_NONE): each walk holds its one CPU, whatever
// else is runnable. The capture for the floor takes it, the proxy
// stopped, so nothing else is in the times.
type dumpTiming struct {
	Services int     `json:"services"`
	Seconds  float64 `json:"seconds"`
	// FirstTenthMs and LastTenthMs are the longest wait between two
	// services among the dump's first and last tenth.
	FirstTenthMs float64 `json:"firstTenthLongestMs"`
	LastTenthMs  float64 `json:"lastTenthLongestMs"`
}

func (d dumpTiming) String() string {
	return fmt.Sprintf("%d virtual servers in %.1fs; the longest wait between two of them: %.1f ms in the first tenth, %.1f ms in the last",
		d.Services, d.Seconds, d.FirstTenthMs, d.LastTenthMs)
}

// timedWalk lists the virtual servers with one dump, timing the waits
// between them.
func timedWalk(v ipvs.Interface) ([]ipvs.VirtualServer, dumpTiming, error) {
	var vss []ipvs.VirtualServer
	var gaps []time.Duration // gaps[i]: the wait before vss[i]
	start := time.Now()
	last := start
	err := v.WalkVirtualServers(func() { vss, gaps, last = vss[:0], gaps[:0], time.Now() }, func(vs ipvs.VirtualServer) error {
		now := time.Now()
		vss, gaps, last = append(vss, vs), append(gaps, now.Sub(last)), now
		return nil
	})
	return vss, timingOf(gaps, time.Since(start)), err
}

// timingOf sums up a dump from the waits before each of its services.
func timingOf(gaps []time.Duration, took time.Duration) dumpTiming {
	d := dumpTiming{Services: len(gaps), Seconds: took.Seconds()}
	tenth := max(1, len(gaps)/10)
	for i, g := range gaps {
		ms := float64(g.Microseconds()) / 1000
		if i < tenth {
			d.FirstTenthMs = max(d.FirstTenthMs, ms)
		}
		if i >= len(gaps)-tenth {
			d.LastTenthMs = max(d.LastTenthMs, ms)
		}
	}
	return d
}
