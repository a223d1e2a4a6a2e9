//go:build e2e

package main

import (
	"fmt"
	"strings"
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
	// Tenths is the time each tenth of the services took, in dump order:
	// alike when filling a message costs the same all along, growing when
	// the kernel walks further for each message.
	Tenths    [10]float64 `json:"tenthsSeconds"`
	LongestMs float64     `json:"longestWaitMs"` // the longest wait between two services
}

func (d dumpTiming) String() string {
	var b strings.Builder
	for i, t := range d.Tenths {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%.1f", t)
	}
	return fmt.Sprintf("%d virtual servers in %.1fs; each tenth of them in turn (s): %s; the longest wait between two: %.1f ms",
		d.Services, d.Seconds, b.String(), d.LongestMs)
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
	for i, g := range gaps {
		d.Tenths[i*10/len(gaps)] += g.Seconds()
		d.LongestMs = max(d.LongestMs, float64(g.Microseconds())/1000)
	}
	return d
}
