// Package enginetest drives the engine the way tests outside sync need:
// a whole full pass at once. The runner spreads a pass over steps between
// batches; a test that only wants the pass's outcome runs it here.
package enginetest

import (
	"maps"
	"slices"

	"github.com/ipvsproxy/ipvsproxy/sync"
)

// FullSync runs a whole pass at once over want, which must hold every
// service the proxy knows, including those whose state is empty.
func FullSync(rec *sync.Reconciler, want map[string]*sync.ServiceState) (sync.FullSyncResult, error) {
	if err := rec.BeginPass(sync.NewPassKeys(slices.Collect(maps.Keys(want))), rec.ReadForPass()); err != nil {
		return sync.FullSyncResult{}, err
	}
	for {
		step := rec.StepPass(func(k string) *sync.ServiceState { return want[k] }, func() bool { return false })
		if step.Done {
			return rec.FinishPass(), nil
		}
	}
}
