// Package calls counts the calls made to an in-memory fake of a kernel
// adapter, by verb, so tests can assert "one add, no dump" without timing
// anything. Every fake embeds a Counter.
package calls

import (
	"maps"
	"sync"
)

// Counter counts calls by verb. The zero value is ready; it is safe for
// concurrent use and has its own lock, so a fake may count while holding
// its own.
type Counter struct {
	mu     sync.Mutex
	counts map[string]int
}

// Inc counts one call of verb.
func (c *Counter) Inc(verb string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[string]int{}
	}
	c.counts[verb]++
}

// Count returns how many times verb was called since the last
// ResetCounts, failed calls included.
func (c *Counter) Count(verb string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[verb]
}

// Counts returns a copy of every verb's count.
func (c *Counter) Counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		return map[string]int{}
	}
	return maps.Clone(c.counts)
}

// ResetCounts zeroes every count, typically after a test built its
// starting state.
func (c *Counter) ResetCounts() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.counts)
}
