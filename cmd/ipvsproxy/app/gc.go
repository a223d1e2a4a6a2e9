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
// the extra collections cost CPU only during the bursts. At 50 the heap
// peaks at 1.5× the live heap. GOGC (or GOMEMLIMIT) in the environment
// overrides this.
const defaultGOGC = 50

// tuneGC applies defaultGOGC unless GOGC is set.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	debug.SetGCPercent(defaultGOGC)
}
