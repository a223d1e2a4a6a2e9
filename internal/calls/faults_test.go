package calls

import (
	"errors"
	"testing"
)

func TestFaults(t *testing.T) {
	var f Faults[int]
	boom := errors.New("boom")
	if err := f.Check("add", 1); err != nil {
		t.Fatalf("no fault: %v", err)
	}
	undo := f.FailOn("add", func(c int) bool { return c > 1 }, boom)
	if f.Check("add", 1) != nil || f.Check("add", 2) != boom || f.Check("del", 2) != nil {
		t.Error("FailOn: wrong calls failed")
	}
	undo()
	if f.Check("add", 2) != nil {
		t.Error("undo left the fault")
	}
	f.FailTimes(2, "", nil, boom)
	if f.Check("x", 0) != boom || f.Check("y", 0) != boom || f.Check("z", 0) != nil {
		t.Error("FailTimes(2) did not fail exactly the next two calls")
	}
	var seen []string
	stop := f.Record(func(verb string, _ int) { seen = append(seen, verb) })
	_ = f.Check("add", 0)
	stop()
	_ = f.Check("del", 0)
	if len(seen) != 1 || seen[0] != "add" {
		t.Errorf("recorded %v", seen)
	}
	f.Verbs("add")
	defer func() {
		if recover() == nil {
			t.Error("an unknown verb did not panic")
		}
	}()
	f.FailOn("ad", nil, boom)
}
