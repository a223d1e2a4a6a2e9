package sync

import (
	"slices"
	gosync "sync"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// Tracker holds the latest Service and EndpointSlices of every service and
// tells its listener which service keys changed. Informer handlers only
// record and notify; all kernel work happens later, coalesced, in the
// Runner. A key is "namespace/name" of the Service.
type Tracker struct {
	mu       gosync.Mutex
	services map[string]*v1.Service
	// slices maps a service key to its EndpointSlices. Most services have
	// one, so a small slice rather than a map per service (a map costs
	// ~250 bytes even with one entry; at 100,000 services that is 25 MB).
	// Copy on write: a stored slice is never modified, so Get can hand it
	// out without copying.
	slices  map[string][]*ProxySlice
	sliceOf map[string]string // "namespace/slice" → service key
	// unsynced holds the keys changed since a sync last read them
	// (GetToSync), and those whose last sync failed (MarkUnsynced): a key
	// queued again for a change its sync had already read is skipped
	// (Runner.syncTaken). Most of the time it holds the few keys in the
	// queue; unsyncedMost, its largest size since it was last made, lets
	// it be made again small once a start-up's keys have drained (a Go map
	// never shrinks).
	unsynced     map[string]struct{}
	unsyncedMost int

	// OnChange is called (outside the lock) with the key of every service
	// whose Service or EndpointSlices changed; endpoints says which.
	OnChange func(key string, endpoints bool)
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker {
	return &Tracker{
		services: map[string]*v1.Service{},
		slices:   map[string][]*ProxySlice{},
		sliceOf:  map[string]string{},
		unsynced: map[string]struct{}{},
	}
}

// Get returns the Service (nil when deleted or not yet seen) and the
// EndpointSlices of key. The returned objects and slice are shared and
// must not be modified.
func (t *Tracker) Get(key string) (*v1.Service, []*ProxySlice) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.services[key], t.slices[key]
}

// GetToSync is Get for a sync that builds from what it returns: key is
// not Unsynced from now until its next change.
func (t *Tracker) GetToSync(key string) (*v1.Service, []*ProxySlice) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.unsynced, key)
	if len(t.unsynced) == 0 && t.unsyncedMost > unsyncedKeep {
		t.unsynced, t.unsyncedMost = map[string]struct{}{}, 0
	}
	return t.services[key], t.slices[key]
}

// unsyncedKeep is the size up to which the emptied unsynced map is kept
// rather than made again.
const unsyncedKeep = 1024

// Unsynced reports whether key changed since a sync last read it
// (GetToSync), or whether that sync failed (MarkUnsynced).
func (t *Tracker) Unsynced(key string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.unsynced[key]
	return ok
}

// MarkUnsynced says that a sync of key failed: the next one must build
// and sync it again, changed or not.
func (t *Tracker) MarkUnsynced(key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.markLocked(key)
}

func (t *Tracker) markLocked(key string) {
	if key == "" {
		return
	}
	t.unsynced[key] = struct{}{}
	t.unsyncedMost = max(t.unsyncedMost, len(t.unsynced))
}

// Keys returns every service key the tracker knows, with a Service or with
// EndpointSlices.
func (t *Tracker) Keys() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.services)+len(t.slices))
	for k := range t.services {
		keys = append(keys, k)
	}
	for k := range t.slices {
		if _, ok := t.services[k]; !ok {
			keys = append(keys, k)
		}
	}
	return keys
}

// KeysWhere returns the keys of the services for which keep reports true
// (services without a Service object, only slices, are left out).
func (t *Tracker) KeysWhere(keep func(*v1.Service) bool) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var keys []string
	for k, svc := range t.services {
		if keep(svc) {
			keys = append(keys, k)
		}
	}
	return keys
}

func (t *Tracker) notify(key string, endpoints bool) {
	if t.OnChange != nil && key != "" {
		t.OnChange(key, endpoints)
	}
}

// ServiceHandler returns informer callbacks for Services.
func (t *Tracker) ServiceHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.setService(obj) },
		UpdateFunc: func(_, obj any) { t.setService(obj) },
		DeleteFunc: func(obj any) { t.deleteService(obj) },
	}
}

// EndpointSliceHandler returns informer callbacks for EndpointSlices.
func (t *Tracker) EndpointSliceHandler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { t.setSlice(obj) },
		UpdateFunc: func(_, obj any) { t.setSlice(obj) },
		DeleteFunc: func(obj any) { t.deleteSlice(obj) },
	}
}

func (t *Tracker) setService(obj any) {
	svc, ok := obj.(*v1.Service)
	if !ok {
		return
	}
	key := svc.Namespace + "/" + svc.Name
	t.mu.Lock()
	t.services[key] = svc
	t.markLocked(key)
	t.mu.Unlock()
	t.notify(key, false)
}

func (t *Tracker) deleteService(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	svc, ok := obj.(*v1.Service)
	if !ok {
		return
	}
	key := svc.Namespace + "/" + svc.Name
	t.mu.Lock()
	delete(t.services, key)
	t.markLocked(key)
	t.mu.Unlock()
	t.notify(key, false)
}

// proxySlice returns the slice an informer handed over: a ProxySlice
// (StripForProxy made it), or an API EndpointSlice when no transform was
// installed (tools and tests feed those), made into one here.
func proxySlice(obj any) (*ProxySlice, bool) {
	switch s := obj.(type) {
	case *ProxySlice:
		return s, true
	case *discovery.EndpointSlice:
		return NewProxySlice(s), true
	}
	return nil, false
}

// sliceName is the namespace and name of a slice, raw or kept: a deletion
// needs no more (converting a raw slice would parse every endpoint).
func sliceName(obj any) (namespace, name string, ok bool) {
	switch s := obj.(type) {
	case *ProxySlice:
		return s.Namespace, s.Name, true
	case *discovery.EndpointSlice:
		return s.Namespace, s.Name, true
	}
	return "", "", false
}

func (t *Tracker) setSlice(obj any) {
	s, ok := proxySlice(obj)
	if !ok {
		return
	}
	key := s.key()
	id := s.Namespace + "/" + s.Name
	t.mu.Lock()
	// A slice relabelled to another service leaves the old one.
	prev, had := t.sliceOf[id]
	if had && prev != key {
		t.dropSliceLocked(prev, s.Name)
		t.markLocked(prev)
	}
	t.markLocked(key)
	if key != "" {
		t.putSliceLocked(key, s)
		if !had || prev != key {
			t.sliceOf[id] = key
		}
	} else {
		delete(t.sliceOf, id)
	}
	t.mu.Unlock()
	if had && prev != key {
		t.notify(prev, true)
	}
	t.notify(key, true)
}

func (t *Tracker) deleteSlice(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	ns, name, ok := sliceName(obj)
	if !ok {
		return
	}
	id := ns + "/" + name
	t.mu.Lock()
	key, had := t.sliceOf[id]
	if had {
		t.dropSliceLocked(key, name)
		delete(t.sliceOf, id)
		t.markLocked(key)
	}
	t.mu.Unlock()
	if had {
		t.notify(key, true)
	}
}

// putSliceLocked stores s among key's slices, replacing the one of the
// same name, into a new array (copy on write, see Tracker.slices).
func (t *Tracker) putSliceLocked(key string, s *ProxySlice) {
	old := t.slices[key]
	i := slices.IndexFunc(old, func(o *ProxySlice) bool { return o.Name == s.Name })
	next := make([]*ProxySlice, len(old), len(old)+1)
	copy(next, old)
	if i >= 0 {
		next[i] = s
	} else {
		next = append(next, s)
	}
	t.slices[key] = next
}

// dropSliceLocked removes the slice named name from key's slices, into a
// new array (copy on write).
func (t *Tracker) dropSliceLocked(key, name string) {
	old := t.slices[key]
	i := slices.IndexFunc(old, func(o *ProxySlice) bool { return o.Name == name })
	switch {
	case i < 0:
	case len(old) == 1:
		delete(t.slices, key)
	default:
		t.slices[key] = slices.Concat(old[:i], old[i+1:])
	}
}
