package app

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
)

// defaultGOGC is the garbage collector's target growth, in percent of the
// live heap, when the GOGC environment variable is not set.
//
// Go's default, 100, lets the heap grow to twice what is live before it
// collects. ipvsproxy allocates in bursts — the first programming of every
// service, and each full pass — and is otherwise idle, so that headroom is
// mostly the peak RSS of a node agent that runs on every node of the
// cluster: at 10,000 nodes every megabyte counts ten thousand times, while
// the extra collections cost CPU only during the bursts. At 25 the heap
// peaks at 1.25× the live heap. Measured in the sandbox at 5,000 services
// (e2e/bench100k.sh, 2026-12-01): peak RSS 92 MB at 50, 79 MB at 25,
// 71 MB at 10; CPU to program 22 s, 17 s and 23 s, a full pass 1.4 s,
// 1.0 s and 1.9 s — below 25 the collections start to cost more than the
// memory they save. GOGC (or GOMEMLIMIT) in the environment overrides it.
const defaultGOGC = 25

// minHeadroom is the least the heap may grow between two collections.
// Go's own floor, 4 MB, scales with GOGC: at 25 it is 1 MB, so a start-up
// whose live heap grows from nothing collects after every megabyte or
// two — 74 collections until 10,000 services were programmed (280 MB
// allocated), each reading the clock many times (a system call under
// user-mode Linux). With 8 MB the heap target is max(1.25 × live,
// live + 8 MB): the same as GOGC 25 alone from 32 MB live, so the peak of
// a node with more than a few thousand services does not move. Measured
// in the sandbox at 10,000 services (docs/benchmarks.md, session 25):
// 35 collections instead of 74, the proxy's CPU until Ready 6.9 s
// against 7.2–8.0 s, the same peak RSS (90 MB); 16 MB took 6.6–6.7 s
// but raised the peak to 96–97 MB.
const minHeadroom = 8 << 20

// tuneGC applies defaultGOGC, with minHeadroom kept after every
// collection (keepHeadroom), unless GOGC is set. It returns a function
// that stops keeping the headroom.
func tuneGC() (stop func()) {
	if _, set := os.LookupEnv("GOGC"); set {
		return func() {}
	}
	debug.SetGCPercent(defaultGOGC)
	return keepHeadroom()
}

// gcPercentFor is the GC percent that lets a heap of live bytes grow by
// minHeadroom, and never by less than defaultGOGC percent.
func gcPercentFor(live uint64) int {
	if live == 0 {
		live = 1
	}
	return max(defaultGOGC, int((minHeadroom*100+live-1)/live))
}

// gcSentinel is allocated for its finalizer, which runs after the
// collection that found it unreachable; it holds a pointer so that it is
// not a tiny allocation (those share a block, and may never be freed).
type gcSentinel struct{ _ *int }

// keepHeadroom sets the GC percent from the live heap after every
// collection, until stopped.
func keepHeadroom() (stop func()) {
	var stopped atomic.Bool
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	var arm func()
	arm = func() {
		runtime.SetFinalizer(&gcSentinel{}, func(*gcSentinel) {
			if stopped.Load() {
				return
			}
			metrics.Read(sample)
			if sample[0].Value.Kind() == metrics.KindUint64 {
				debug.SetGCPercent(gcPercentFor(sample[0].Value.Uint64()))
			}
			arm()
		})
	}
	arm()
	return func() { stopped.Store(true) }
}
