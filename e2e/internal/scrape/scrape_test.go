//go:build e2e

package scrape

import "testing"

func TestParse(t *testing.T) {
	m := Parse("# HELP x\n# TYPE x counter\nx 3\nipvsproxy_syncs_total{kind=\"full\"} 2\nbad line\n")
	if m.Get("x") != 3 || m.Get(`ipvsproxy_syncs_total{kind="full"}`) != 2 || len(m.Values) != 2 {
		t.Errorf("parsed %v", m.Values)
	}
}
