package calls

import (
	"fmt"
	"sync"
	"testing"
)

func TestCounter(t *testing.T) {
	var c Counter
	if got := fmt.Sprint(c.Counts()); got != "map[]" {
		t.Errorf("zero value counts %s", got)
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 100; j++ {
				c.Inc("add")
			}
		}()
	}
	wg.Wait()
	c.Inc("list")
	if c.Count("add") != 800 || fmt.Sprint(c.Counts()) != "map[add:800 list:1]" {
		t.Errorf("counts %v", c.Counts())
	}
	snapshot := c.Counts()
	c.ResetCounts()
	if c.Count("add") != 0 || snapshot["add"] != 800 {
		t.Errorf("reset: %v, earlier copy %v", c.Counts(), snapshot)
	}
}
