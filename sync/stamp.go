package sync

import (
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// stampResolution is how stale a change's time stamp may be. The stamps
// feed the network-programming latency (whose first bucket is 0.25 s),
// the last-queued gauge and /healthz's pending check: milliseconds do
// not matter to any of them.
const stampResolution = 10 * time.Millisecond

// stampClock time-stamps changes as they arrive from the informers. It
// reads the clock at most about once per stampResolution and hands that
// reading to every change in between: at start-up the informers hand the
// runner ten thousand notifications in a burst, and in user-mode Linux
// (the sandbox) a clock read is a system call — one per notification was
// over a quarter of the proxy's CPU at 10,000 services (docs/benchmarks.md).
// On a real kernel the clock is cheap and this saves nothing, nor costs.
type stampClock struct {
	clock clock.WithDelayedExecution
	last  atomic.Int64 // the reading in use, unix nanos; 0: read afresh
}

// Now returns a time at most about stampResolution before the present.
func (c *stampClock) Now() time.Time {
	if n := c.last.Load(); n != 0 {
		return time.Unix(0, n)
	}
	now := c.clock.Now()
	if c.last.CompareAndSwap(0, now.UnixNano()) {
		c.clock.AfterFunc(stampResolution, func() { c.last.Store(0) })
	}
	return now
}
