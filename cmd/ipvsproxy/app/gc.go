package app

import (
	"os"
	"runtime/debug"
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

// tuneGC applies defaultGOGC unless GOGC is set.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	debug.SetGCPercent(defaultGOGC)
}
