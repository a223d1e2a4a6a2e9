package sync

import (
	"context"
	"testing"
)

// BenchmarkRequeuedUnchanged is the start-up's second batch where it
// holds only keys that the batch before had synced with their latest
// change (queued again by a slice that arrived while they waited),
// 10,000 of them: "handed-back" is the runner since they are skipped
// (syncTaken), "synced-again" each built and synced as before, with
// nothing to write either way. ns/key is one key's share of the batch.
func BenchmarkRequeuedUnchanged(b *testing.B) {
	const n = 10_000
	nd := newBenchNode(b, n)
	tracker := NewTracker()
	for i := range nd.cluster.keys {
		tracker.ServiceHandler().OnAdd(nd.cluster.services[i], true)
		for _, s := range nd.cluster.slices[i] {
			tracker.EndpointSliceHandler().OnAdd(s, true)
		}
	}
	runner := NewRunner(RunnerConfig{Build: testConfig, Events: &recordedEvents{}}, tracker, nd.rec)
	ctx := context.Background()
	requeue := func(mark bool) {
		for _, k := range nd.cluster.keys {
			if mark {
				tracker.MarkUnsynced(k)
			}
			runner.enqueue(k)
		}
	}
	requeue(false)
	runner.next(ctx) // the first batch: every key is new to the tracker
	for _, mode := range []struct {
		name  string
		again bool
	}{{"handed-back", false}, {"synced-again", true}} {
		b.Run(mode.name, func(b *testing.B) {
			nd.k.ResetCounts()
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				requeue(mode.again)
				b.StartTimer()
				runner.next(ctx)
			}
			if w, d := kernelOps(nd.k); w != 0 || d != 0 {
				b.Fatalf("unchanged keys cost %d writes and %d dumps", w, d)
			}
			if want := map[bool]int{false: n, true: 0}[mode.again]; runner.unchangedKeys != want {
				b.Fatalf("%d keys handed back, want %d", runner.unchangedKeys, want)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/key")
		})
	}
}
