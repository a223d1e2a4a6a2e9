package sync

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"

	"github.com/ipvsproxy/ipvsproxy/ipvs"
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

// TestUsable: the ready endpoints a filter keeps, or the serving
// terminating ones when none is ready; when every endpoint is kept the
// answer is eps itself, with no copy, and an append to it leaves eps alone.
func TestUsable(t *testing.T) {
	key := func(s string) ipvs.RealKey { return ipvs.RealKey{Address: netip.MustParseAddr(s), Port: 80} }
	ready := func(s string) endpoint { return endpoint{key: key(s), ready: true, serving: true} }
	draining := func(s string) endpoint { return endpoint{key: key(s), serving: true, terminating: true} }
	all := func(endpoint) bool { return true }
	notB := func(e endpoint) bool { return e.key != key("10.0.0.2") }
	keys := func(eps []endpoint) string {
		var out []string
		for _, e := range eps {
			out = append(out, e.key.Address.String())
		}
		return strings.Join(out, ",")
	}
	for _, tc := range []struct {
		name string
		eps  []endpoint
		keep func(endpoint) bool
		want string
	}{
		{"all ready", []endpoint{ready("10.0.0.1"), ready("10.0.0.2")}, all, "10.0.0.1,10.0.0.2"},
		{"filtered", []endpoint{ready("10.0.0.1"), ready("10.0.0.2"), ready("10.0.0.3")}, notB, "10.0.0.1,10.0.0.3"},
		{"ready before draining", []endpoint{draining("10.0.0.1"), ready("10.0.0.2")}, all, "10.0.0.2"},
		{"only draining", []endpoint{draining("10.0.0.1"), {key: key("10.0.0.2"), terminating: true}}, all, "10.0.0.1"},
		{"none", nil, all, ""},
	} {
		if got := keys(usable(tc.eps, tc.keep)); got != tc.want {
			t.Errorf("%s: usable = %q, want %q", tc.name, got, tc.want)
		}
	}

	eps := make([]endpoint, 2, 4)
	eps[0], eps[1] = ready("10.0.0.1"), ready("10.0.0.2")
	got := usable(eps, all)
	_ = append(got, ready("10.0.0.9"))
	if spare := eps[:3][2]; spare.key.Address.IsValid() {
		t.Errorf("an append to usable's answer wrote %s into eps's spare capacity", spare.key)
	}
	if n := testing.AllocsPerRun(100, func() { usable(eps, all) }); n != 0 {
		t.Errorf("usable of all-ready endpoints allocated %.0f times, want 0", n)
	}
}
