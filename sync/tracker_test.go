package sync

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
)

// sliceNames lists the names of a service's slices as Get returns them.
func sliceNames(sl []*ProxySlice) []string {
	var out []string
	for _, s := range sl {
		out = append(out, s.Name)
	}
	return out
}

// TestTrackerSlices: slices are added, replaced by name, moved when
// relabelled to another service and removed; every change notifies the
// services it touched; a slice list handed out by Get never changes under
// its holder (copy on write).
func TestTrackerSlices(t *testing.T) {
	tr := NewTracker()
	var notified []string
	tr.OnChange = func(key string, endpoints bool) {
		if !endpoints {
			t.Errorf("slice change for %s reported as a Service change", key)
		}
		notified = append(notified, key)
	}
	h := tr.EndpointSliceHandler()
	a := NewProxySlice(slice("ns", "web", "web-a", "", 80, v1.ProtocolTCP, ep{ip: "10.0.0.1"}))
	b := NewProxySlice(slice("ns", "web", "web-b", "", 80, v1.ProtocolTCP, ep{ip: "10.0.0.2"}))
	h.OnAdd(a, false)
	h.OnAdd(b, false)
	_, held := tr.Get("ns/web")
	if got := sliceNames(held); !slices.Equal(got, []string{"web-a", "web-b"}) {
		t.Fatalf("after two adds: %v", got)
	}

	a2 := NewProxySlice(slice("ns", "web", "web-a", "", 80, v1.ProtocolTCP, ep{ip: "10.0.0.9"}))
	h.OnUpdate(a, a2)
	_, now := tr.Get("ns/web")
	if len(now) != 2 || now[0] != a2 {
		t.Errorf("update did not replace web-a in place: %v", sliceNames(now))
	}
	if held[0] != a {
		t.Error("the list Get returned earlier changed under its holder")
	}

	moved := NewProxySlice(slice("ns", "api", "web-b", "", 80, v1.ProtocolTCP, ep{ip: "10.0.0.2"}))
	h.OnUpdate(b, moved)
	_, web := tr.Get("ns/web")
	_, api := tr.Get("ns/api")
	if !slices.Equal(sliceNames(web), []string{"web-a"}) || !slices.Equal(sliceNames(api), []string{"web-b"}) {
		t.Errorf("after relabel: web %v, api %v", sliceNames(web), sliceNames(api))
	}

	h.OnDelete(cache.DeletedFinalStateUnknown{Key: "ns/web-a", Obj: a2})
	h.OnDelete(moved)
	_, web = tr.Get("ns/web")
	_, api = tr.Get("ns/api")
	if len(web) != 0 || len(api) != 0 || len(tr.Keys()) != 0 {
		t.Errorf("after deletes: web %v, api %v, keys %v", sliceNames(web), sliceNames(api), tr.Keys())
	}
	want := []string{"ns/web", "ns/web", "ns/web", "ns/web", "ns/api", "ns/web", "ns/api"}
	if !slices.Equal(notified, want) {
		t.Errorf("notified %v, want %v", notified, want)
	}
}
