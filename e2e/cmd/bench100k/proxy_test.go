//go:build e2e

package main

import (
	"testing"
	"time"
)

func scraped(kv map[string]float64) metrics { return metrics{Values: kv} }

func TestFullPassesFromMetrics(t *testing.T) {
	// A proxy with the full-pass histogram: its count and sum alone.
	a := scraped(map[string]float64{fullHistCount: 1, fullHistSum: 20, syncSum: 50, incrCount: 10, fullCount: 1})
	b := scraped(map[string]float64{fullHistCount: 3, fullHistSum: 80, syncSum: 51, incrCount: 900, fullCount: 3})
	if d, n, ok := fullPassesBetween(a, b); !ok || n != 2 || d != 30*time.Second {
		t.Errorf("with the histogram: %v %d %v, want 30s over 2 passes", d, n, ok)
	}
	if passesDone(b) != 3 {
		t.Errorf("passes done %v", passesDone(b))
	}
	// Without it: the sync histogram's growth, only when no incremental
	// sync ended in between.
	a = scraped(map[string]float64{fullCount: 1, incrCount: 4, syncSum: 10})
	b = scraped(map[string]float64{fullCount: 2, incrCount: 4, syncSum: 14.5})
	if d, n, ok := fullPassesBetween(a, b); !ok || n != 1 || d != 4500*time.Millisecond {
		t.Errorf("without the histogram: %v %d %v, want 4.5s", d, n, ok)
	}
	b.Values[incrCount] = 5
	if _, _, ok := fullPassesBetween(a, b); ok {
		t.Error("a pass beside an incremental sync was timed")
	}
	if _, _, ok := fullPassesBetween(a, a); ok {
		t.Error("no pass ended, yet one was timed")
	}
}
