//go:build e2e

package main

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"
)

// changeTargetMs is issue 20's: p99 of the changes made during full
// passes at most 100 ms (a benchmark: stated, never failed on).
const changeTargetMs = 100.0

// The classes a change falls in, by when it was written.
const (
	classDuring  = "during a pass"
	classBetween = "between passes"
	// classUnknown: written after the end of the last pass the proxy
	// logged, so whether a pass had begun is not known.
	classUnknown = "unclassified"
)

// passSpan is one full pass, seconds from the launch, with its longest
// kernel read (one dump: a change arriving meanwhile waits for it).
type passSpan struct {
	StartSeconds  float64 `json:"startSeconds"`
	EndSeconds    float64 `json:"endSeconds"`
	LongestRead   string  `json:"longestRead,omitempty"`
	LongestReadMs float64 `json:"longestReadMs,omitempty"`
}

// latencyStats are one class's latencies (nearest rank).
type latencyStats struct {
	Count int     `json:"count"`
	P50Ms float64 `json:"p50Ms"`
	P99Ms float64 `json:"p99Ms"`
	MaxMs float64 `json:"maxMs"`
}

// changeLatency is the report of the changes (changes.go).
type changeLatency struct {
	Made        int     `json:"changes"`
	PollEveryMs float64 `json:"pollEveryMs"`
	// PassesFrom says where the passes' spans come from.
	PassesFrom     string         `json:"passesFrom"`
	Passes         []passSpan     `json:"passes"`
	During         latencyStats   `json:"duringPass"`
	Between        latencyStats   `json:"betweenPasses"`
	Unclassified   latencyStats   `json:"unclassified"`
	TimedOut       int            `json:"timedOut"`
	Target         string         `json:"targetP99DuringPass"`
	RestoreSeconds float64        `json:"restoreSeconds"`
	Error          string         `json:"error,omitempty"`
	List           []changeResult `json:"list"`
}

const passesFrom = `the proxy's log at -v=2: each "Full pass done" line's time minus its duration (klog's µs clock, the same host clock as the benchmark's)`

// report classifies the changes by the passes in the proxy's log (read
// now: the later, the more passes have ended) and sums them up.
func (ch *changer) report(logPath string) changeLatency {
	text, err := os.ReadFile(logPath)
	cl := changeLatency{Made: len(ch.results), PollEveryMs: float64(changePollEvery.Microseconds()) / 1000,
		PassesFrom: passesFrom, RestoreSeconds: ch.restoreSeconds}
	if ch.err != nil {
		cl.Error = ch.err.Error()
	}
	if err != nil {
		cl.Error = strings.TrimPrefix(cl.Error+"; ", "; ") + "proxy log: " + err.Error()
	}
	cl.Passes = parsePasses(string(text), ch.begin)
	synced := parseSynced(string(text), ch.begin)
	var during, between, unknown []float64
	for _, res := range ch.results {
		res.Class = classify(res.WrittenSeconds, cl.Passes)
		res.Split = split(res, ch.begin.Add(time.Duration(res.WrittenSeconds*float64(time.Second))), synced)
		switch res.Class {
		case classDuring:
			during = append(during, res.LatencyMs)
		case classBetween:
			between = append(between, res.LatencyMs)
		default:
			unknown = append(unknown, res.LatencyMs)
		}
		if res.TimedOut {
			cl.TimedOut++
		}
		cl.List = append(cl.List, res)
	}
	cl.During, cl.Between, cl.Unclassified = stats(during), stats(between), stats(unknown)
	switch {
	case cl.During.Count == 0:
		cl.Target = "not checked (no change during a pass)"
	case cl.During.P99Ms <= changeTargetMs:
		cl.Target = "met"
	default:
		cl.Target = "MISSED"
	}
	logf("changes: during passes %v, between %v, unclassified %d; p99 during ≤ %.0f ms: %s",
		cl.During, cl.Between, cl.Unclassified.Count, changeTargetMs, cl.Target)
	return cl
}

// parsePasses reads the full passes from the proxy's log (after the last
// start banner): klog's text format,
//
//	I1202 06:10:02.123456     183 batch.go:303] "Full pass done" services=2002 adopted=0 failed=0 duration="1.234s"
//
// and each pass's read line before it (proxies from before it have none):
//
//	I1202 06:10:01.523456     183 fullsync.go:80] "Full pass read the kernel" took="612ms" longestRead="virtual servers" longestReadTook="301ms"
func parsePasses(text string, launched time.Time) []passSpan {
	if i := strings.LastIndex(text, "===== bench100k: starting "); i >= 0 {
		text = text[i:]
	}
	var out []passSpan
	var read map[string]string // the read line of the pass being parsed
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, `] "Full pass read the kernel"`) {
			read = klogValues(line)
			continue
		}
		if !strings.Contains(line, `] "Full pass done"`) {
			continue
		}
		longest, longestTook := read["longestRead"], durationSeconds(read["longestReadTook"])
		read = nil
		d := durationSeconds(klogValues(line)["duration"])
		at, ok := klogTime(line, launched)
		if !ok || d < 0 {
			continue
		}
		end := at.Sub(launched).Seconds()
		span := passSpan{StartSeconds: end - d, EndSeconds: end}
		if longestTook >= 0 && longest != "" {
			span.LongestRead, span.LongestReadMs = longest, longestTook*1000
		}
		out = append(out, span)
	}
	return out
}

// classify puts a change written at t (seconds from the launch) in a
// pass, between passes (before the last logged end: every pass logs its
// end, so outside every span no pass ran), or unclassified.
func classify(t float64, passes []passSpan) string {
	lastEnd := math.Inf(-1)
	for _, p := range passes {
		if t >= p.StartSeconds && t <= p.EndSeconds {
			return classDuring
		}
		lastEnd = max(lastEnd, p.EndSeconds)
	}
	if t < lastEnd {
		return classBetween
	}
	return classUnknown
}

// longestRead is the pass whose longest read was the longest.
func longestRead(passes []passSpan) passSpan {
	var out passSpan
	for _, p := range passes {
		if p.LongestReadMs > out.LongestReadMs {
			out = p
		}
	}
	return out
}

func stats(ms []float64) latencyStats {
	if len(ms) == 0 {
		return latencyStats{}
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	rank := func(p float64) float64 { return s[max(0, int(math.Ceil(p*float64(len(s))))-1)] }
	return latencyStats{Count: len(s), P50Ms: rank(0.50), P99Ms: rank(0.99), MaxMs: s[len(s)-1]}
}

func (l latencyStats) String() string {
	return fmt.Sprintf("%d (p50 %.1f ms, p99 %.1f ms, max %.1f ms)", l.Count, l.P50Ms, l.P99Ms, l.MaxMs)
}

// slowest is the change that took longest; false when there is none.
func slowest(list []changeResult) (changeResult, bool) {
	if len(list) == 0 {
		return changeResult{}, false
	}
	return slices.MaxFunc(list, func(a, b changeResult) int { return cmp.Compare(a.LatencyMs, b.LatencyMs) }), true
}

// changesMarkdown is the summary's table of change latencies.
func (r *report) changesMarkdown(b *strings.Builder) {
	c := r.Changes
	if c.Made == 0 && c.Error == "" {
		b.WriteString("\nChange latency during full passes (issue 20): not measured.\n")
		return
	}
	fmt.Fprintf(b, "\nChange latency during full passes (issue 20): %d changes, one every %v–%v to a random generated service "+
		"(an endpoint's address replaced, or the endpoint made unready), each timed from its write to the fake API server "+
		"until the kernel's real servers in service for that virtual server matched (one netlink request every %.0f ms); "+
		"the passes from %s.\n\n", c.Made, changeGapMin, changeGapMax, c.PollEveryMs, c.PassesFrom)
	b.WriteString("| changes written | count | p50 (ms) | p99 (ms) | max (ms) |\n|---|---:|---:|---:|---:|\n")
	for _, row := range []struct {
		name string
		s    latencyStats
	}{{classDuring, c.During}, {classBetween, c.Between}, {classUnknown + " (after the last pass logged as ended)", c.Unclassified}} {
		fmt.Fprintf(b, "| %s | %d | %.1f | %.1f | %.1f |\n", row.name, row.s.Count, row.s.P50Ms, row.s.P99Ms, row.s.MaxMs)
	}
	fmt.Fprintf(b, "\n| measure | value |\n|---|---:|\n")
	fmt.Fprintf(b, "| target: p99 of the changes during passes ≤ %.0f ms | %s |\n", changeTargetMs, c.Target)
	fmt.Fprintf(b, "| changes not seen within %v (counted at that) | %d |\n", changeTimeout, c.TimedOut)
	fmt.Fprintf(b, "| full passes in the proxy's log | %d |\n", len(c.Passes))
	if slow, ok := slowest(c.List); ok {
		fmt.Fprintf(b, "| the slowest change (%s): its longest gap between two polls (every %.0f ms: a longer gap means the guest held the benchmark up too) | %.1f ms: %.1f ms |\n",
			slow.Class, c.PollEveryMs, slow.LatencyMs, slow.MaxPollGapMs)
	}
	if p := longestRead(c.Passes); p.LongestRead != "" {
		fmt.Fprintf(b, "| longest kernel read of a pass (one dump; since 97960ff beside the sync loop, before a change waited for it) | %.0f ms (%s) |\n",
			p.LongestReadMs, p.LongestRead)
	}
	fmt.Fprintf(b, "| restored slices back in the kernel, drained servers gone (s) | %s |\n", seconds(c.RestoreSeconds, "never"))
	if c.Error != "" {
		fmt.Fprintf(b, "| stopped early | %s |\n", c.Error)
	}
	c.slowChangesMarkdown(b)
}
