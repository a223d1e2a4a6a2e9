package sync

import (
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// deadline is a flag a timer sets. A pass's step asks after every
// service whether its time is up, the deferred writes whether they have
// waited long enough; a clock read each time was 5 % of the proxy's CPU
// at 10,000 services in the sandbox, where every clock read is a system
// call.
type deadline struct {
	reached atomic.Bool
	timer   clock.Timer
}

// newDeadline returns a deadline d from now (reached already when d is
// not positive).
func newDeadline(clk clock.WithDelayedExecution, d time.Duration) *deadline {
	dl := &deadline{}
	if d <= 0 {
		dl.reached.Store(true)
		return dl
	}
	dl.timer = clk.AfterFunc(d, func() { dl.reached.Store(true) })
	return dl
}

func (d *deadline) passed() bool { return d.reached.Load() }

// stop releases the timer.
func (d *deadline) stop() {
	if d.timer != nil {
		d.timer.Stop()
	}
}
