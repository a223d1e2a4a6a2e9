package sync

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
)

// TestCollectEndpointsOnceEach: an endpoint listed twice (in two slices,
// as during a slice's split, or twice in one) is collected once, both
// below and past the size where duplicates are found by a map instead of
// a scan; the list is made at its size and is nil when empty.
func TestCollectEndpointsOnceEach(t *testing.T) {
	for _, n := range []int{1, linearDedup - 1, linearDedup, linearDedup + 1, 3 * linearDedup} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			var eps []ep
			for i := range n {
				eps = append(eps, ep{ip: fmt.Sprintf("10.1.%d.%d", i/200, 1+i%200)})
			}
			a := slice("default", "web", "web-a", "http", 8080, v1.ProtocolTCP, eps...)
			// The second slice repeats every other endpoint and adds one.
			var again []ep
			for i := 0; i < n; i += 2 {
				again = append(again, eps[i], eps[i])
			}
			b := slice("default", "web", "web-b", "http", 8080, v1.ProtocolTCP, append(again, ep{ip: "10.2.0.1"})...)
			sp := &v1.ServicePort{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}
			got := collectEndpoints(proxySlices(a, b), sp, false, testNode)
			if len(got) != n+1 {
				t.Fatalf("collected %d endpoints, want %d", len(got), n+1)
			}
			seen := map[string]bool{}
			for _, e := range got {
				if k := e.key.String(); seen[k] {
					t.Fatalf("%s collected twice", k)
				} else {
					seen[k] = true
				}
			}
			if got[n].key.String() != "10.2.0.1:8080" {
				t.Errorf("last endpoint %s, want 10.2.0.1:8080 (order of the slices)", got[n].key)
			}
		})
	}
	none := slice("default", "web", "web-a", "http", 8080, v1.ProtocolTCP)
	none.Endpoints = append(none.Endpoints, none.Endpoints...)
	if got := collectEndpoints(proxySlices(none), &v1.ServicePort{Name: "http"}, false, ""); got != nil {
		t.Errorf("no endpoints: %v, want nil", got)
	}
}
