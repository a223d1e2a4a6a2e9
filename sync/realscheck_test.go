package sync

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
)

// TestRealsWindowsCoverEveryService: the windows of successive passes
// follow one another around the sorted keys, so that ⌈n / count⌉ passes
// read every service's real servers; a count of 0, or of every key,
// reads them all.
func TestRealsWindowsCoverEveryService(t *testing.T) {
	var keys []string
	for i := range 10 {
		keys = append(keys, fmt.Sprintf("ns/svc-%d", i))
	}
	readIn := func(w realsWindow) (read []int) {
		for i, k := range keys {
			if w.reads(k) {
				read = append(read, i)
			}
		}
		return read
	}
	from := ""
	var got [][]int
	for range 3 {
		w := newRealsWindow(keys, from, 4)
		got = append(got, readIn(w))
		from = w.next
	}
	want := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}, {0, 1, 8, 9}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("three passes of 4 of 10 read %v, want %v", got, want)
	}
	// A key the next pass's keys no longer have: the window begins at the
	// one after it.
	w := newRealsWindow(slices.Delete(slices.Clone(keys), 4, 5), "ns/svc-4", 2)
	if !w.reads("ns/svc-5") || !w.reads("ns/svc-6") || w.reads("ns/svc-7") || w.reads("ns/svc-3") {
		t.Errorf("the window after a deleted key: reads svc-3..7 = %v %v %v %v %v, want svc-5 and svc-6 only",
			w.reads("ns/svc-3"), w.reads("ns/svc-4"), w.reads("ns/svc-5"), w.reads("ns/svc-6"), w.reads("ns/svc-7"))
	}
	for _, count := range []int{0, 10, 11} {
		if w := newRealsWindow(keys, "ns/svc-5", count); len(readIn(w)) != len(keys) {
			t.Errorf("a window of %d reads %d of %d services, want all", count, len(readIn(w)), len(keys))
		}
	}
}

// TestPassesReadRealServersInTurn: with 4 of 10 services' real servers
// read per pass, drift in the real servers is repaired window by window
// (each pass dumps only its window's), while a virtual server deleted
// behind ipvsproxy's back is restored by the first pass wherever it is;
// after three passes the kernel is as a correct engine leaves it. The
// same with the real servers read ahead beside the loop.
func TestPassesReadRealServersInTurn(t *testing.T) {
	for _, ahead := range []bool{false, true} {
		t.Run(fmt.Sprintf("readAhead=%v", ahead), func(t *testing.T) {
			k := newKernel(t)
			e := newEngine(t, k)
			if ahead {
				var gate chan struct{}
				e, gate = newReadAheadEngine(t, k)
				close(gate)
			}
			const n = 10
			vs := func(i int) ipvs.ServiceKey {
				return ipvs.ServiceKey{Address: manyServiceIP(i), Protocol: ipvs.TCP, Port: 80}
			}
			first := func(i int) ipvs.RealKey { return ipvs.RealKey{Address: manyServiceEndpoint(i, 0), Port: 8080} }
			for i := range n {
				e.apply(manyService(i, 3))
			}
			for i := range n {
				must(t, k.IPVS.DeleteRealServer(vs(i), first(i)))
			}
			must(t, k.IPVS.DeleteVirtualServer(vs(9)))
			missing := func() (gone []int) {
				for i := range n {
					reals, err := k.IPVS.ListRealServers(vs(i))
					must(t, err)
					if !slices.ContainsFunc(reals, func(rs ipvs.RealServer) bool { return rs.RealKey == first(i) }) {
						gone = append(gone, i)
					}
				}
				return gone
			}

			for pass, want := range []struct {
				missing            string
				dumps, fromRecords int
			}{
				// svc-9's virtual server is restored whole by the first pass.
				{missing: "[4 5 6 7 8]", dumps: 4, fromRecords: 5},
				{missing: "[8]", dumps: 4, fromRecords: 6},
				{missing: "[]", dumps: 4, fromRecords: 6},
			} {
				k.ResetCounts()
				res := e.passReadingRealsOf(4)
				if got := fmt.Sprint(missing()); got != want.missing {
					t.Errorf("pass %d: the services still missing a real server: %s, want %s", pass+1, got, want.missing)
				}
				if d := k.IPVS.Count("WalkRealServers"); d != want.dumps || res.RealsFromRecords != want.fromRecords {
					t.Errorf("pass %d: %d real-server dumps, %d virtual servers' taken from the records; want %d and %d",
						pass+1, d, res.RealsFromRecords, want.dumps, want.fromRecords)
				}
			}
			assertText(t, "kernel after three passes", k.text(), e.reference())
		})
	}
}

// passReadingRealsOf runs a whole pass over e's services that reads the
// real servers of n of them (the window after the last pass's).
func (e *engine) passReadingRealsOf(n int) FullSyncResult {
	e.t.Helper()
	must(e.t, e.rec.BeginPass(NewPassKeys(e.keys()).ReadingRealsOf(n), e.rec.ReadForPass()))
	for {
		var step StepResult
		if e.rec.pass.ahead != nil {
			step = StepResult{Done: e.stepWhenReady()}
		} else {
			step = e.rec.StepPass(e.want, func() bool { return false })
		}
		if len(step.Failed) > 0 {
			e.t.Fatalf("pass step failed: %v", step.Failed)
		}
		if step.Done {
			res := e.rec.FinishPass()
			if len(res.Failed) > 0 || res.Prune != nil {
				e.t.Fatalf("pass failures: %v prune: %v", res.Failed, res.Prune)
			}
			checkCounts(e.t, e.rec)
			return res
		}
	}
}

// TestRealsToReadIsTheShareOfTheCheckPeriod: a pass reads the share of
// the services' real servers that the time since the last pass began is
// of the check period, rounded up; all of them without a period, for the
// first pass, or when a period has gone by.
func TestRealsToReadIsTheShareOfTheCheckPeriod(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name   string
		period time.Duration
		last   time.Time
		since  time.Duration
		n      int
		want   int
	}{
		{"no period", 0, t0, 30 * time.Second, 10000, 0},
		{"first pass", 5 * time.Minute, time.Time{}, 30 * time.Second, 10000, 0},
		{"a tenth of the period", 5 * time.Minute, t0, 30 * time.Second, 10000, 1000},
		{"rounded up", 5 * time.Minute, t0, 30 * time.Second, 3, 1},
		{"a pass that came late", 5 * time.Minute, t0, 90 * time.Second, 10000, 3000},
		{"a whole period", 5 * time.Minute, t0, 6 * time.Minute, 10000, 0},
		{"a million services over an hour", time.Hour, t0, 30 * time.Second, 1_000_000, 8334},
	} {
		r := &Runner{cfg: RunnerConfig{RealServerCheckPeriod: c.period}, lastPassBegan: c.last, passStart: t0.Add(c.since)}
		if got := r.realsToRead(c.n); got != c.want {
			t.Errorf("%s: realsToRead(%d) = %d, want %d", c.name, c.n, got, c.want)
		}
	}
}
