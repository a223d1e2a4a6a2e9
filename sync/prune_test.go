package sync

import (
	"testing"

	discovery "k8s.io/api/discovery/v1"
)

// TestPruneInStepsWithChangesBetween: after a restart, the pass prunes
// what the proxy's earlier run left for services deleted meanwhile, one
// object per step, while changes are synced between the steps — a stale
// service coming back, a live one deleted, a new one — and leaves the
// kernel exactly as a clean node programmed with the final objects.
func TestPruneInStepsWithChangesBetween(t *testing.T) {
	k := newKernel(t)
	before := newEngine(t, k)
	for i := 0; i < 10; i++ {
		before.apply(manyService(i, 2))
	}
	e := newEngine(t, k) // restarted: svc-5 … svc-9 were deleted while it was down
	for i := 0; i < 5; i++ {
		s, sl := manyService(i, 2)
		key := s.Namespace + "/" + s.Name
		e.services[key], e.slices[key] = s, []*discovery.EndpointSlice{sl}
	}
	e.beginPass()
	for e.rec.servicesLeftInPass() > 0 {
		e.step()
	}
	pruneSteps := 0
	for !e.step() {
		pruneSteps++
		switch pruneSteps {
		case 1: // a deleted service comes back before its objects are checked, or after
			e.apply(manyService(7, 2))
		case 4:
			e.remove("ns/svc-1")
		case 9:
			e.apply(manyService(40, 1))
		case 15:
			e.apply(manyService(8, 3))
		}
	}
	e.finishPass()
	// 5 stale services: 5 virtual servers, 5 addresses and 10 set
	// entries (KUBE-CLUSTER-IP, KUBE-IPVS-IPS), besides the live ones.
	if pruneSteps < 20 {
		t.Errorf("the prune took %d steps; one object per step should take more than 20", pruneSteps)
	}
	assertText(t, "kernel after a prune with changes between its steps", k.text(), e.reference())
}
