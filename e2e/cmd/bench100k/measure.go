//go:build e2e

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/proc"
)

// programmed is when the kernel was found complete.
type programmed struct {
	// Seconds: start → the end of the IPVS read (checkIPVS) that found
	// every virtual server complete (the sets were complete before it).
	Seconds float64 `json:"seconds"`
	// PreviousReadSeconds: start → the end of the read before, which was
	// not complete (-1: none): the kernel became complete within
	// (previous, seconds].
	PrevReadSeconds float64 `json:"previousReadSeconds"`
	// PrevReadBeganSeconds: start → the beginning of that read (-1:
	// none); /readyz answering 200 before it is answering too early.
	PrevReadBeganSeconds float64 `json:"previousReadBeganSeconds"`
	// SetsSeconds: start → `ipset list -t` first showed every expected
	// entry count (polled every 2 s).
	SetsSeconds float64 `json:"setsSeconds"`
	// ReadSeconds: how long the completing read took (the kernel was
	// complete somewhere within it at the latest).
	ReadSeconds float64   `json:"completingReadSeconds"`
	Reads       int       `json:"ipvsReads"`
	IPVS        ipvsCheck `json:"ipvs"`
	// AtReady: where the guest's CPU went until /readyz was seen 200
	// (guestcpu.go); nil when it never was or /proc/stat was unreadable.
	AtReady *cpuSplit `json:"cpuUntilReady,omitempty"`
}

// setsReached: every set the workload fills holds at least its entries
// (the cheap gate before the expensive IPVS read).
func (w *workload) setsReached(sets []setInfo) bool {
	for name, n := range w.expectedEntries() {
		if setEntries(sets, name) < n {
			return false
		}
	}
	return true
}

// waitProgrammed polls the kernel until it holds the whole workload: every
// 2 s `ipset list -t` (one process, headers only); once the sets are full
// and the proxy says it is ready (ready), IPVS too (checkIPVS), at most
// every 4× its last read's cost.
//
// The IPVS read waits for ready because it is not a light poll: one dump
// of every virtual server and, per virtual server, its real servers —
// 22–35 s at 10,000 services, 5–8 minutes at 100,000 — and user-mode
// Linux has one CPU and no kernel preemption, so a dump's parts stop the
// whole guest for tens of milliseconds each. Begun when the sets were
// full, it ran through the proxy's first full pass and slowed it (pass
// steps of 100–185 ms against 20 ms; the first pass 15–21 s against 7–12 s
// for the later ones, at 10,000): the benchmark was measuring its own
// load. Read after ready, it checks the proxy's word instead: a read that
// finds the kernel incomplete then is /readyz answering too early
// (readyVerdict). A proxy that never answers 200 is read anyway once the
// sets have been full for as long as they took to fill (at least a
// minute).
func waitProgrammed(c *config, w *workload, proxy *proc.Process, begin time.Time, launchCPU *guestCPU, ready func() bool) (programmed, error) {
	p := programmed{PrevReadSeconds: -1, PrevReadBeganSeconds: -1}
	var last ipvsCheck
	var lastBegan, lastEnd time.Time
	lastLog := time.Now()
	profiled := 0 // quarters of KUBE-CLUSTER-IP profiled so far
	for {
		if err := proxy.Exited(); err != nil {
			return p, err
		}
		_, sets, err := listSets()
		if err != nil {
			return p, err
		}
		if q := 4 * setEntries(sets, "KUBE-CLUSTER-IP") / w.n; q > profiled && q < 4 {
			profiled = q
			go saveCPUProfile(filepath.Join(c.results, fmt.Sprintf("cpu-at-%d-percent.pprof", 25*q)))
		}
		if p.AtReady == nil && launchCPU != nil && ready() {
			p.AtReady = cpuUntilReady(proxy, begin, *launchCPU)
		}
		reached := w.setsReached(sets)
		if reached && p.SetsSeconds == 0 {
			p.SetsSeconds = time.Since(begin).Seconds()
			logf("sets complete after %.1fs; reading IPVS once /readyz answers", p.SetsSeconds)
		}
		if reached && readGate(ready, begin, p.SetsSeconds) && time.Since(lastEnd) >= 4*last.Took {
			began := time.Now()
			chk, err := checkIPVS(w)
			if err != nil {
				return p, err
			}
			p.Reads++
			end := time.Now()
			if !lastEnd.IsZero() {
				p.PrevReadSeconds = lastEnd.Sub(begin).Seconds()
				p.PrevReadBeganSeconds = lastBegan.Sub(begin).Seconds()
			}
			if chk.done() {
				p.Seconds, p.ReadSeconds, p.IPVS = end.Sub(begin).Seconds(), chk.Took.Seconds(), chk
				return p, nil
			}
			last, lastBegan, lastEnd = chk, began, end
		}
		if time.Since(lastLog) >= 30*time.Second {
			u, _ := proxy.Usage()
			logf("%4.0fs: KUBE-CLUSTER-IP %d/%d, KUBE-IPVS-IPS %d, KUBE-NODE-PORT-TCP %d/%d, KUBE-LOOP-BACK %d; last IPVS read: %v; proxy RSS %d MB, CPU %.0fs",
				time.Since(begin).Seconds(), setEntries(sets, "KUBE-CLUSTER-IP"), w.expectedEntries()["KUBE-CLUSTER-IP"], setEntries(sets, "KUBE-IPVS-IPS"),
				setEntries(sets, "KUBE-NODE-PORT-TCP"), w.nodePorts, setEntries(sets, "KUBE-LOOP-BACK"), last, u.RSSKB/1024, u.CPUSeconds)
			lastLog = time.Now()
		}
		if time.Since(begin) > c.programTimeout {
			return p, fmt.Errorf("kernel not complete after %v: %v", c.programTimeout, last)
		}
		time.Sleep(2 * time.Second)
	}
}

// cpuUntilReady is the guest's and the proxy's CPU since the launch;
// nil when /proc/stat cannot be read now.
func cpuUntilReady(proxy *proc.Process, begin time.Time, launch guestCPU) *cpuSplit {
	now, err := readGuestCPU()
	if err != nil {
		logf("CPU until ready: %v", err)
		return nil
	}
	u, _ := proxy.Usage()
	s := &cpuSplit{Seconds: time.Since(begin).Seconds(), Guest: now.minus(launch), Proxy: u}
	logf("CPU until ready: %v", s)
	return s
}

// readGate reports whether the IPVS reads may begin, the sets being
// full since setsAt seconds after begin: once the proxy is ready, or once
// the sets have been full for as long as they took to fill (at least a
// minute: a proxy without /readyz, or one that never gets there, is
// still checked).
func readGate(ready func() bool, begin time.Time, setsAt float64) bool {
	waited := time.Since(begin).Seconds() - setsAt
	return ready() || waited >= max(setsAt, time.Minute.Seconds())
}

// verifySetsAndAddrs checks `ipset list -t` entry counts exactly (every
// set; ipvsproxy's sets that the workload does not fill must be empty)
// and the ClusterIPs on kube-ipvs0; the output is kept in the results.
func verifySetsAndAddrs(c *config, w *workload, r *report, when string) string {
	out, sets, err := listSets()
	_ = os.WriteFile(filepath.Join(c.results, "ipset-list-t-"+when+".txt"), []byte(out), 0o644)
	if err != nil {
		return err.Error()
	}
	ok, missing := w.setsComplete(sets)
	addrs, aerr := linkAddrCount("kube-ipvs0")
	r.Sets, r.KubeIPVS0Addrs = sets, addrs
	var bad []string
	for _, s := range sets {
		if s.Entries != s.Expected {
			bad = append(bad, fmt.Sprintf("%s %d (want %d)", s.Name, s.Entries, s.Expected))
		}
	}
	logf("%s: ipset list -t: %d sets, entry counts as expected: %v %v; kube-ipvs0: %d addresses (want %d)",
		when, len(sets), ok, bad, addrs, w.wantAddrs())
	switch {
	case !ok:
		return fmt.Sprintf("%s: sets wrong: %v, missing %v", when, bad, missing)
	case aerr != nil || addrs != w.wantAddrs():
		return fmt.Sprintf("%s: kube-ipvs0 holds %d addresses, want %d (%v)", when, addrs, w.wantAddrs(), aerr)
	}
	return ""
}

// fullPass is one (or, when two ended between scrapes, the mean of
// several) periodic full passes.
type fullPass struct {
	EndedSeconds float64 `json:"endedSeconds"` // start → the scrape that saw it ended
	Seconds      float64 `json:"seconds"`
	Passes       int     `json:"passes"`
}

// scrapeEvery is the metrics cadence while full passes are timed: each
// scrape makes the proxy list the kernel's virtual servers for its
// per-service traffic metrics (ipvsstats), as a Prometheus would.
const scrapeEvery = 20 * time.Second

// timeFullPasses waits for the proxy's first full pass to have finished,
// then times c.fullPasses more from its metrics (fullPassBetween).
func timeFullPasses(c *config, proxy *proc.Process, begin time.Time, r *report) error {
	scrapeTimed := func() (metrics, error) {
		start := time.Now()
		m, err := scrapeProxy()
		r.LongestScrapeSeconds = max(r.LongestScrapeSeconds, time.Since(start).Seconds())
		return m, err
	}
	prev, err := scrapeTimed()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(c.passTimeout * time.Duration(c.fullPasses+1))
	for time.Now().Before(deadline) {
		if passesDone(prev) >= 1 && r.FirstFullPassSeconds == 0 {
			r.FirstFullPassSeconds = time.Since(begin).Seconds()
			logf("first full pass finished by %.1fs", r.FirstFullPassSeconds)
		}
		timed := 0
		for _, fp := range r.FullPasses {
			timed += fp.Passes
		}
		if timed >= c.fullPasses {
			return nil
		}
		time.Sleep(scrapeEvery)
		if err := proxy.Exited(); err != nil {
			return err
		}
		cur, err := scrapeTimed()
		if err != nil {
			return err
		}
		if r.FirstFullPassSeconds != 0 {
			if d, n, ok := fullPassesBetween(prev, cur); ok {
				fp := fullPass{EndedSeconds: time.Since(begin).Seconds(), Seconds: d.Seconds(), Passes: n}
				r.FullPasses = append(r.FullPasses, fp)
				u, _ := proxy.Usage()
				logf("full pass: %.1fs (%d ended since the last scrape); proxy RSS %d MB, peak %d MB", fp.Seconds, n, u.RSSKB/1024, u.HWMKB/1024)
			} else if passesDone(cur) > passesDone(prev) {
				logf("a full pass ended beside incremental syncs; not timed")
			}
		}
		prev = cur
	}
	return fmt.Errorf("timed %d of %d full passes within %v", len(r.FullPasses), c.fullPasses, c.passTimeout*time.Duration(c.fullPasses+1))
}

// readMeminfo keeps the guest's memory picture: what the kernel's own
// objects (IPVS, addresses, sets: slab and per-CPU) take is the growth of
// Slab and Percpu.
func readMeminfo() map[string]int {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return nil
	}
	out := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch k {
		case "MemTotal", "MemFree", "MemAvailable", "Slab", "SUnreclaim", "Percpu", "Shmem", "PageTables", "AnonPages":
			out[k+"KB"], _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return out
}
