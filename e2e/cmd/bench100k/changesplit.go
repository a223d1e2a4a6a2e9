//go:build e2e

package main

import (
	"fmt"
	"strings"
	"time"
)

// Where a slow change's time went. The proxy logs, at -v=2, one
// "Synced changes" line per batch that synced changed services: the
// first service, how long the oldest change waited for the loop and how
// long the batch took (sync/batch.go logSyncedChanges). With the write's
// time and the time the benchmark saw the kernel right, a change splits
// into four parts.

// changeSplit is one change's four parts, in milliseconds.
type changeSplit struct {
	// DeliveredMs: the write to the fake API server → the proxy's handler
	// queued the service (the watch's send, the informer's decoding; the
	// proxy's stamp is up to 10 ms early, so this may read up to 10 ms
	// short).
	DeliveredMs float64 `json:"deliveredMs"`
	WaitedMs    float64 `json:"waitedMs"` // queued → its batch began
	BatchMs     float64 `json:"batchMs"`  // the batch that synced it
	// AfterMs: the batch's end → the benchmark's poll saw the kernel
	// right (the poll's period and round trip, or a guest that held the
	// benchmark up).
	AfterMs float64 `json:"afterMs"`
}

// syncedLine is one "Synced changes" line.
type syncedLine struct {
	at           time.Time // the batch's end (the line's time)
	first        string    // the first service synced
	waited, took time.Duration
}

// parseSynced reads the "Synced changes" lines of the proxy's log after
// its last start banner, in the order logged:
//
//	I1203 18:30:01.250000     110 batch.go:120] "Synced changes" services=1 first="ns/svc-7" waited="3ms" took="12ms"
func parseSynced(text string, launched time.Time) []syncedLine {
	if i := strings.LastIndex(text, "===== bench100k: starting "); i >= 0 {
		text = text[i:]
	}
	var out []syncedLine
	for _, line := range strings.Split(text, "\n") {
		if !strings.Contains(line, `] "Synced changes"`) {
			continue
		}
		v := klogValues(line)
		at, ok := klogTime(line, launched)
		waited, took := durationSeconds(v["waited"]), durationSeconds(v["took"])
		if !ok || v["first"] == "" || waited < 0 || took < 0 {
			continue
		}
		out = append(out, syncedLine{at: at, first: v["first"],
			waited: time.Duration(waited * float64(time.Second)), took: time.Duration(took * float64(time.Second))})
	}
	return out
}

// syncedSlack: the batch's line is logged after its end, and the kernel
// seen right by a poll begun before the line's time stamp was taken.
const syncedSlack = 50 * time.Millisecond

// split finds the batch that synced res, written at written — the first
// line for its service logged after the write and before it was seen
// (plus syncedSlack) — and splits res by it; nil when no batch had it
// first.
func split(res changeResult, written time.Time, lines []syncedLine) *changeSplit {
	seen := written.Add(time.Duration(res.LatencyMs * float64(time.Millisecond)))
	for _, l := range lines {
		if l.first != res.Service || l.at.Before(written) || l.at.After(seen.Add(syncedSlack)) {
			continue
		}
		began := l.at.Add(-l.took)
		queued := began.Add(-l.waited)
		return &changeSplit{DeliveredMs: ms(queued.Sub(written)), WaitedMs: ms(l.waited),
			BatchMs: ms(l.took), AfterMs: ms(seen.Sub(l.at))}
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// slowChangesMarkdown is the table of the changes during passes over the
// target, each split by its batch's line.
func (c changeLatency) slowChangesMarkdown(b *strings.Builder) {
	var slow []changeResult
	for _, res := range c.List {
		if res.Class == classDuring && res.LatencyMs > changeTargetMs {
			slow = append(slow, res)
		}
	}
	if len(slow) == 0 {
		return
	}
	fmt.Fprintf(b, "\nThe changes during passes over %.0f ms, split by the proxy's \"Synced changes\" line of the batch that synced them "+
		"(delivered: the write → the proxy queued it; waited: for the sync loop; batch: the batch that synced it; after: the batch's end → the benchmark's poll saw it):\n\n",
		changeTargetMs)
	b.WriteString("| written (s) | latency (ms) | delivered | waited | batch | after | longest poll gap (ms) |\n|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range slow {
		fmt.Fprintf(b, "| %.1f | %.1f | ", res.WrittenSeconds, res.LatencyMs)
		if s := res.Split; s != nil {
			fmt.Fprintf(b, "%.1f | %.1f | %.1f | %.1f |", s.DeliveredMs, s.WaitedMs, s.BatchMs, s.AfterMs)
		} else {
			b.WriteString("no batch logged it first | | | |")
		}
		fmt.Fprintf(b, " %.1f |\n", res.MaxPollGapMs)
	}
}
