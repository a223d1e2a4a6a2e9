package sync

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	// As in the proxy's binary (cmd/ipvsproxy/app/metrics.go): client-go's
	// workqueues get component-base's Prometheus metrics provider.
	_ "k8s.io/component-base/metrics/prometheus/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
)

// countingClock counts the clock reads of whoever uses it.
type countingClock struct {
	*clocktesting.FakeClock
	reads atomic.Int64
}

func (c *countingClock) Now() time.Time {
	c.reads.Add(1)
	return c.FakeClock.Now()
}

func (c *countingClock) Since(t time.Time) time.Duration {
	c.reads.Add(1)
	return c.FakeClock.Since(t)
}

// TestRunnerQueueCostIsNotPerKeyHeld: a start-up batch holds thousands of
// keys taken from the queue at once. While they sync, the queue must not
// read the clock for each of them over and over (a named workqueue's
// metrics do, every 500 ms, under the queue's lock).
func TestRunnerQueueCostIsNotPerKeyHeld(t *testing.T) {
	const keys = 2000
	clk := &countingClock{FakeClock: clocktesting.NewFakeClock(time.Now())}
	q := newRunnerQueue(newKeyQueue(func(string) bool { return false }), clk)
	defer q.ShutDown()
	for i := range keys {
		q.Add(fmt.Sprintf("ns/svc-%d", i))
	}
	for range keys {
		q.Get() // all of them processing, as in one batch
	}
	before := clk.reads.Load()
	for range 20 { // ten seconds of a long batch
		clk.Step(500 * time.Millisecond)
		time.Sleep(time.Millisecond) // let a ticker's reader run, if there is one
	}
	if n := clk.reads.Load() - before; n > keys/10 {
		t.Errorf("the queue read the clock %d times while %d keys were processing for 10 s; want a few at most", n, keys)
	}
}
