//go:build e2e

package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ipvsproxy/ipvsproxy/e2e/internal/proc"
)

// report is everything measured, saved as bench100k.json and
// summary.md in the results folder (also when a check failed).
type report struct {
	N            int    `json:"services"`
	EndpointsPer int    `json:"endpointsPerService"`
	NodePorts    int    `json:"nodePortServices"`
	Samples      int    `json:"sampledServices"`
	WantVS       int    `json:"wantVirtualServers"`
	WantReals    int    `json:"wantRealServers"`
	Commit       string `json:"ipvsproxyVersion"`
	ProxyArgs    string `json:"ipvsproxyArgs"`
	// LaunchProfiled: the start-up ran under the CPU profiler (slower).
	LaunchProfiled bool `json:"launchProfiled"`

	FillSeconds    float64 `json:"fakeClientsetFillSeconds"`
	GeneratorRSSKB int     `json:"generatorRssKB"` // this process after filling the fake

	Programmed              programmed  `json:"programmed"`
	Startup                 startup     `json:"startup"`
	AtProgrammed            proc.Usage  `json:"proxyAtProgrammed"`
	HeapInuseAtProgrammedMB float64     `json:"proxyHeapInuseAtProgrammedMB"`
	FirstFullPassSeconds    float64     `json:"firstFullPassDoneSeconds"`
	FullPasses              []fullPass  `json:"periodicFullPasses"`
	Steady                  steadyCPU   `json:"steadyCpu"`
	Sets                    []setInfo   `json:"sets"`
	KubeIPVS0Addrs          int         `json:"kubeIpvs0Addresses"`
	Traffic                 []vipResult `json:"traffic"`
	VIPsAnswering           int         `json:"vipsAnswering"`
	FinalIPVS               ipvsCheck   `json:"finalIpvs"`
	FinalProcIPVS           ipvsCheck   `json:"finalProcIpvs"`
	Final                   proc.Usage  `json:"proxyFinal"`
	HeapInuseFinalMB        float64     `json:"proxyHeapInuseFinalMB"`
	API                     string      `json:"apiServerServed"`
	LongestScrapeSeconds    float64     `json:"longestScrapeSeconds"`
	Floor                   floorReport `json:"floor"`
	Mem                     struct {
		Boot, BeforeProxy, AtProgrammed, Final map[string]int
	} `json:"guestMeminfo"`

	// Issue 20's change latency during full passes (changes.go).
	Changes changeLatency `json:"changeLatency"`

	Failures []string `json:"failures"`
}

func (r *report) save(dir string) {
	data, err := json.MarshalIndent(r, "", " ")
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "bench100k.json"), data, 0o644)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, "summary.md"), []byte(r.markdown()), 0o644)
	}
	if err != nil {
		logf("saving the report: %v", err)
	}
	fmt.Print("\n" + r.markdown())
}

// kernelMB is the growth of the guest kernel's slab and per-CPU memory
// from before the proxy started to a later point: IPVS, addresses, sets.
func kernelMB(before, after map[string]int) float64 {
	if before == nil || after == nil {
		return 0
	}
	return float64(after["SlabKB"]+after["PercpuKB"]-before["SlabKB"]-before["PercpuKB"]) / 1024
}

func (r *report) markdown() string {
	var b strings.Builder
	row := func(k, format string, v ...any) { fmt.Fprintf(&b, "| %s | "+format+" |\n", append([]any{k}, v...)...) }
	fmt.Fprintf(&b, "N = %d services × %d endpoints (%d NodePort): %d virtual servers, %d real servers; %s\n\n",
		r.N, r.EndpointsPer, r.NodePorts, r.WantVS, r.WantReals, r.Commit)
	if r.LaunchProfiled {
		b.WriteString("The start-up ran under the CPU profiler (--profile-launch: cpu-from-launch.pprof); its times are slower than without.\n\n")
	}
	b.WriteString("| measure | value |\n|---|---:|\n")
	prev := "none"
	if r.Programmed.PrevReadSeconds >= 0 {
		prev = fmt.Sprintf("%.1f", r.Programmed.PrevReadSeconds)
	}
	row("start → kernel complete (s)", "%.1f (the IPVS read that showed it took %.1f; the read before, incomplete, ended at: %s)",
		r.Programmed.Seconds, r.Programmed.ReadSeconds, prev)
	row("start → every set's entries (s)", "%.1f", r.Programmed.SetsSeconds)
	if a := r.Programmed.AtReady; a != nil {
		row("CPU from the launch until /readyz was seen 200 (s; polled every 2 s)", "%s", a)
	}
	row("proxy CPU until complete (s)", "%.0f", r.AtProgrammed.CPUSeconds)
	row("proxy RSS at complete / peak so far (MB)", "%d / %d", r.AtProgrammed.RSSKB/1024, r.AtProgrammed.HWMKB/1024)
	row("proxy heap in use at complete (MB)", "%.0f", r.HeapInuseAtProgrammedMB)
	row("start → first full pass finished, by (s)", "%.1f (seen at a scrape)", r.FirstFullPassSeconds)
	for i, fp := range r.FullPasses {
		row(fmt.Sprintf("full pass after complete, %d (s)", i+1), "%.1f (mean of %d ended by %.0fs)", fp.Seconds, fp.Passes, fp.EndedSeconds)
	}
	row("proxy CPU on the programmed node: complete → last timed full pass", "%s", r.Steady)
	row("proxy peak RSS, VmHWM, at the end (MB)", "%d", r.Final.HWMKB/1024)
	row("proxy RSS / heap in use at the end (MB)", "%d / %.0f", r.Final.RSSKB/1024, r.HeapInuseFinalMB)
	row("proxy CPU, whole run (s)", "%.0f", r.Final.CPUSeconds)
	row("sampled ClusterIPs answering from all 10 pods", "%d / %d", r.VIPsAnswering, len(r.Traffic))
	row("kernel at the end (netlink)", "%d VS, %d real servers, %d complete, %d foreign", r.FinalIPVS.VS, r.FinalIPVS.Reals, r.FinalIPVS.Complete, r.FinalIPVS.Foreign)
	if r.FinalProcIPVS.Want > 0 {
		row("kernel at the end (/proc/net/ip_vs)", "%d VS, %d real servers, %d complete, %d foreign; read in %.0f s",
			r.FinalProcIPVS.VS, r.FinalProcIPVS.Reals, r.FinalProcIPVS.Complete, r.FinalProcIPVS.Foreign, r.FinalProcIPVS.Took.Seconds())
	} else {
		row("kernel at the end (/proc/net/ip_vs)", "not read (its cost grows with the square of N; --proc-check-max)")
	}
	row("longest /metrics scrape of the proxy (s)", "%.1f", r.LongestScrapeSeconds)
	row("addresses on kube-ipvs0", "%d", r.KubeIPVS0Addrs)
	row("guest kernel slab+percpu growth at complete (MB)", "%.0f", kernelMB(r.Mem.BeforeProxy, r.Mem.AtProgrammed))
	row("guest MemAvailable at complete / end (MB)", "%d / %d", r.Mem.AtProgrammed["MemAvailableKB"]/1024, r.Mem.Final["MemAvailableKB"]/1024)
	row("generator + API server RSS after filling the fake (MB)", "%d", r.GeneratorRSSKB/1024)
	row("fake clientset filled in (s)", "%.1f", r.FillSeconds)
	r.startupMarkdown(&b)
	r.floorMarkdown(&b)
	r.changesMarkdown(&b)
	b.WriteString("\n`ipset list -t` (entries / expected):\n\n| set | type | entries | expected |\n|---|---|---:|---:|\n")
	for _, s := range r.Sets {
		if s.Entries != 0 || s.Expected != 0 {
			fmt.Fprintf(&b, "| %s | %s | %d | %d |\n", s.Name, s.Type, s.Entries, s.Expected)
		}
	}
	fmt.Fprintf(&b, "\n(the other %d sets: 0 entries, as expected)\n\nAPI server: %s\n", r.emptySets(), r.API)
	if len(r.Failures) > 0 {
		fmt.Fprintf(&b, "\nFAILED:\n- %s\n", strings.Join(r.Failures, "\n- "))
	}
	return b.String()
}

// kernelExact: every wanted virtual server complete, nothing else.
func (r *report) kernelExact(c ipvsCheck) bool {
	return c.done() && c.Foreign == 0 && c.WrongReal == 0 && c.VS == r.WantVS && c.Reals == r.WantReals
}

func (r *report) emptySets() int {
	n := 0
	for _, s := range r.Sets {
		if s.Entries == 0 && s.Expected == 0 {
			n++
		}
	}
	return n
}
