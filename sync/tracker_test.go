package sync

import (
	"fmt"
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

// TestTrackerUnsynced: every change to a service — its Service, a slice
// added, moved to another service or deleted — makes its key unsynced
// until a sync reads it (GetToSync); a failed sync makes it unsynced
// again; Get, which every other reader uses, does not count as a sync.
func TestTrackerUnsynced(t *testing.T) {
	tr := NewTracker()
	unsynced := func() []string {
		var out []string
		for _, k := range []string{"ns/api", "ns/web"} {
			if tr.Unsynced(k) {
				out = append(out, k)
			}
		}
		return out
	}
	check := func(after string, want ...string) {
		t.Helper()
		if got := unsynced(); !slices.Equal(got, want) {
			t.Errorf("after %s: unsynced %v, want %v", after, got, want)
		}
	}
	tr.ServiceHandler().OnAdd(svc("ns", "web", "10.96.0.1", "80"), false)
	check("the Service", "ns/web")
	tr.Get("ns/web")
	check("a Get", "ns/web")
	tr.GetToSync("ns/web")
	check("its sync read it")

	h := tr.EndpointSliceHandler()
	a := NewProxySlice(slice("ns", "web", "web-a", "", 80, v1.ProtocolTCP, ep{ip: "10.0.0.1"}))
	h.OnAdd(a, false)
	check("a slice", "ns/web")
	tr.GetToSync("ns/web")
	moved := NewProxySlice(slice("ns", "api", "web-a", "", 80, v1.ProtocolTCP, ep{ip: "10.0.0.1"}))
	h.OnUpdate(a, moved)
	check("the slice moved", "ns/api", "ns/web")
	tr.GetToSync("ns/api")
	tr.GetToSync("ns/web")
	h.OnDelete(moved)
	check("the slice deleted", "ns/api")
	tr.GetToSync("ns/api")
	tr.MarkUnsynced("ns/web")
	check("a failed sync", "ns/web")
	tr.GetToSync("ns/web")
	tr.ServiceHandler().OnDelete(svc("ns", "web", "10.96.0.1", "80"))
	check("the Service deleted", "ns/web")
}

// TestTrackerUnsyncedShrinks: the map of unsynced keys is made again once
// a start-up's thousands of keys have all been synced, not kept at its
// largest for the life of the process.
func TestTrackerUnsyncedShrinks(t *testing.T) {
	tr := NewTracker()
	n := 3 * unsyncedKeep
	for i := range n {
		tr.ServiceHandler().OnAdd(svc("ns", fmt.Sprintf("s%d", i), "10.96.0.1", "80"), false)
	}
	if tr.unsyncedMost != n {
		t.Fatalf("largest size %d, want %d", tr.unsyncedMost, n)
	}
	for i := range n {
		tr.GetToSync(fmt.Sprintf("ns/s%d", i))
	}
	if tr.unsyncedMost != 0 || len(tr.unsynced) != 0 {
		t.Errorf("after every key synced: %d keys, largest size %d; want a new, empty map", len(tr.unsynced), tr.unsyncedMost)
	}
}
