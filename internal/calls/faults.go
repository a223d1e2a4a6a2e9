package calls

import (
	"fmt"
	"slices"
	"sync"
)

// Faults is the one way a test makes a fake fail, shared by every fake
// that embeds it next to its Counter: FailOn fails the calls of a verb
// (the method's name; "" is every verb) that match accepts (nil: all)
// with err, until the returned undo is called; FailTimes does it for the
// next n matching calls only; Record sees every call. C is the fake's
// description of one call (its Call type). When several faults match,
// the earliest installed wins.
//
// The zero value has no fault and accepts every verb; Verbs restricts
// them, so a misspelt verb panics instead of never matching. It is safe
// for concurrent use, with its own lock, so a fake may consult it while
// holding its own.
type Faults[C any] struct {
	mu      sync.Mutex
	verbs   map[string]bool
	faults  []*fault[C]
	records []*record[C]
	nextID  int
}

type fault[C any] struct {
	id    int
	verb  string
	match func(C) bool
	err   error
	left  int // calls left to fail; <0 means until undone
}

type record[C any] struct {
	id int
	fn func(verb string, c C)
}

// Verbs names the verbs FailOn and FailTimes accept.
func (f *Faults[C]) Verbs(verbs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.verbs = map[string]bool{}
	for _, v := range verbs {
		f.verbs[v] = true
	}
}

// FailOn makes the calls of verb that match accepts fail with err, without
// changing any state, until undo is called. Failed calls are still
// counted.
func (f *Faults[C]) FailOn(verb string, match func(C) bool, err error) (undo func()) {
	return f.add(verb, match, err, -1)
}

// FailTimes is FailOn for the next n matching calls only.
func (f *Faults[C]) FailTimes(n int, verb string, match func(C) bool, err error) {
	if n > 0 {
		f.add(verb, match, err, n)
	}
}

// Record calls fn with every call's verb and description, before any
// fault is consulted, until undo is called: a test's log of what the code
// under test asked of the kernel.
func (f *Faults[C]) Record(fn func(verb string, c C)) (undo func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextID++
	id := f.nextID
	f.records = append(f.records, &record[C]{id: id, fn: fn})
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.records = slices.DeleteFunc(f.records, func(r *record[C]) bool { return r.id == id })
	}
}

func (f *Faults[C]) add(verb string, match func(C) bool, err error, n int) func() {
	if err == nil {
		panic("calls.Faults: a fault with a nil error")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if verb != "" && f.verbs != nil && !f.verbs[verb] {
		panic(fmt.Sprintf("calls.Faults: unknown verb %q", verb))
	}
	f.nextID++
	id := f.nextID
	f.faults = append(f.faults, &fault[C]{id: id, verb: verb, match: match, err: err, left: n})
	return func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.faults = slices.DeleteFunc(f.faults, func(ft *fault[C]) bool { return ft.id == id })
	}
}

// Check is what a fake asks at the start of a call: it records the call
// and returns the error of the earliest matching fault, or nil.
func (f *Faults[C]) Check(verb string, c C) error {
	f.mu.Lock()
	records := slices.Clone(f.records)
	f.mu.Unlock()
	for _, r := range records {
		r.fn(verb, c)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i, ft := range f.faults {
		if (ft.verb != "" && ft.verb != verb) || (ft.match != nil && !ft.match(c)) {
			continue
		}
		if ft.left > 0 {
			ft.left--
			if ft.left == 0 {
				f.faults = slices.Delete(f.faults, i, i+1)
			}
		}
		return ft.err
	}
	return nil
}
