package sorted

import (
	"cmp"
	"fmt"
	"testing"
)

func TestWalk(t *testing.T) {
	var got []string
	Walk([]int{1, 3, 5, 7}, []int{2, 3, 7, 8, 9}, cmp.Compare[int],
		func(a int) { got = append(got, fmt.Sprintf("-%d", a)) },
		func(b int) { got = append(got, fmt.Sprintf("+%d", b)) },
		func(a, _ int) { got = append(got, fmt.Sprintf("=%d", a)) })
	if fmt.Sprint(got) != "[-1 +2 =3 -5 =7 +8 +9]" {
		t.Errorf("walk: %v", got)
	}
	got = nil
	Walk(nil, []int{1}, cmp.Compare[int], func(int) { t.Error("onlyOld on empty old") },
		func(b int) { got = append(got, fmt.Sprint(b)) }, func(int, int) { t.Error("both on empty old") })
	if fmt.Sprint(got) != "[1]" {
		t.Errorf("empty old: %v", got)
	}
}
