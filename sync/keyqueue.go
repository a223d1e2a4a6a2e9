package sync

import "sync/atomic"

// keyQueue is the order of the runner's queue of service keys (the
// storage of client-go's workqueue, workqueue.Queue): critical keys
// first, each tier first in, first out.
//
// Why: on a node that starts with tens of thousands of services the
// informers deliver everything within seconds and programming takes
// minutes, in whatever order the lists came. The API server's Service and
// cluster DNS must not wait behind the rest.
//
// The workqueue calls these methods under its own lock; waiting is the
// only field read outside it (by the sync loop, between two services).
type keyQueue struct {
	critical func(key string) bool

	first, rest []string
	inFirst     map[string]bool // the keys in first
	// promoted counts, per key moved to first while it waited in rest,
	// the entries of rest that are stale: each is skipped when its turn
	// comes. A key queued for its slices (not critical yet) becomes
	// critical when its Service arrives, with its label, while it waits.
	promoted map[string]int
	stale    int          // the sum of promoted
	waiting  atomic.Int64 // len(first)
}

func newKeyQueue(critical func(string) bool) *keyQueue {
	return &keyQueue{critical: critical, inFirst: map[string]bool{}, promoted: map[string]int{}}
}

// Push queues a key the workqueue does not hold yet.
func (q *keyQueue) Push(key string) {
	if q.critical(key) {
		q.pushFirst(key)
		return
	}
	q.rest = append(q.rest, key)
}

// Touch is told of a key queued again while it waits: a key that has
// become critical moves to the first tier.
func (q *keyQueue) Touch(key string) {
	if q.inFirst[key] || !q.critical(key) {
		return
	}
	q.promoted[key]++
	q.stale++
	q.pushFirst(key)
}

func (q *keyQueue) pushFirst(key string) {
	q.first = append(q.first, key)
	q.inFirst[key] = true
	q.waiting.Add(1)
}

// Len is the number of keys waiting, each counted once.
func (q *keyQueue) Len() int { return len(q.first) + len(q.rest) - q.stale }

// Pop takes the next key; the workqueue calls it only when Len > 0.
func (q *keyQueue) Pop() string {
	if len(q.first) > 0 {
		key := q.first[0]
		q.first[0] = ""
		q.first = q.first[1:]
		delete(q.inFirst, key)
		q.waiting.Add(-1)
		return key
	}
	for {
		key := q.rest[0]
		q.rest[0] = ""
		q.rest = q.rest[1:]
		n := q.promoted[key]
		if n == 0 {
			return key
		}
		// A stale entry: the key went through the first tier.
		if n == 1 {
			delete(q.promoted, key)
		} else {
			q.promoted[key] = n - 1
		}
		q.stale--
	}
}

// criticalWaiting reports whether a critical key waits: the sync loop
// asks between two services of a batch.
func (q *keyQueue) criticalWaiting() bool { return q.waiting.Load() > 0 }

// criticalFirst returns keys with the critical ones first, each part in
// its order; keys itself when no critical key follows an ordinary one
// (the queue hands them out that way unless one was queued while a
// batch was being taken).
func criticalFirst(keys []string, critical func(string) bool) []string {
	isCrit := make([]bool, len(keys))
	ordinary, behind := false, false
	for i, k := range keys {
		isCrit[i] = critical(k)
		behind = behind || isCrit[i] && ordinary
		ordinary = ordinary || !isCrit[i]
	}
	if !behind {
		return keys
	}
	out := make([]string, 0, len(keys))
	for _, first := range []bool{true, false} {
		for i, k := range keys {
			if isCrit[i] == first {
				out = append(out, k)
			}
		}
	}
	return out
}
