//go:build e2e

package ipsets

import "testing"

func TestParse(t *testing.T) {
	out := "Name: A\nType: hash:ip\nHeader: family inet\nNumber of entries: 3\n\nName: B\nType: bitmap:port\nNumber of entries: 0\n"
	sets := Parse(out)
	if len(sets) != 2 || sets[0].Entries != 3 || sets[0].Header != "family inet" || sets[1].Type != "bitmap:port" ||
		Find(sets, "B") != 0 || Find(sets, "C") != -1 {
		t.Errorf("parsed %+v", sets)
	}
}
