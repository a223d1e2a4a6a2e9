//go:build e2e

package main

import (
	"strconv"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	clienttesting "k8s.io/client-go/testing"
)

// The fake API server's resourceVersions and change events. The fake
// clientset's tracker keeps a version beside each object but never puts
// it in the object, forgets deletions, and counts per resource; its own
// watches panic when 100 events wait unread. So the server keeps its own:
// a reactor in front of the tracker gives every create, update and delete
// of a served collection the next resourceVersion (one counter for all,
// as etcd's revision), writes it into the stored object, and keeps the
// event in a ring of the last logCap; watches read the ring, never a copy
// per watcher. The reactor runs under the fake's lock, as every List
// does, so a list's resourceVersion (set by the same reactor) is exactly
// the last change it reflects.

// logCap bounds the events kept: a watch resumed from a resourceVersion
// older than the ring gets 410 Gone (the client relists). The benchmark
// makes about two changes a second and its watches resume within
// seconds; a few thousand events are a few MB at most.
const logCap = 4096

// baseRV is the resourceVersion of the objects created before the server
// (they carry none): the state every later change builds on.
const baseRV = 1

// logEvent is one change as a watch sends it.
type logEvent struct {
	rv       int64
	typ      watch.EventType
	resource string // a resource's name: services, endpointslices, nodes
	ns       string
	obj      runtime.Object // never written once logged: watchers copy it to encode
}

// changeLog is the ring of events and the last resourceVersion given.
type changeLog struct {
	mu      sync.Mutex
	seq     int64 // the last resourceVersion given; the ring's events are seq-n+1 … seq
	ring    []logEvent
	first   int // the oldest event's slot
	n       int
	changed chan struct{} // closed and replaced at each append
}

func newChangeLog(capacity int) *changeLog {
	return &changeLog{seq: baseRV, ring: make([]logEvent, capacity), changed: make(chan struct{})}
}

// current is the last resourceVersion given.
func (l *changeLog) current() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq
}

// append logs e, whose rv must be current()+1.
func (l *changeLog) append(e logEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == len(l.ring) {
		l.first = (l.first + 1) % len(l.ring)
		l.n--
	}
	l.ring[(l.first+l.n)%len(l.ring)] = e
	l.n++
	l.seq = e.rv
	close(l.changed)
	l.changed = make(chan struct{})
}

// since returns up to max events after rv, the resourceVersion they
// reach (rv when none), and a channel closed at the next append; gone
// when events after rv have left the ring already.
func (l *changeLog) since(rv int64, max int) (evs []logEvent, last int64, next <-chan struct{}, gone bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if rv < l.seq-int64(l.n) {
		return nil, rv, l.changed, true
	}
	for e := rv + 1; e <= l.seq && len(evs) < max; e++ {
		evs = append(evs, l.ring[(l.first+int(e-(l.seq-int64(l.n)+1)))%len(l.ring)])
	}
	last = rv
	if len(evs) > 0 {
		last = evs[len(evs)-1].rv
	}
	return evs, last, l.changed, false
}

// loggedResources are the collections whose changes are logged.
var loggedResources = map[string]bool{"services": true, "endpointslices": true, "nodes": true}

// react is the reactor in front of the fake's tracker for the served
// collections: lists get the current resourceVersion; creates, updates
// and deletes the next one, and are logged. Anything else (other
// resources, subresources, patches) goes on to the tracker unlogged.
func (l *changeLog) react(t clienttesting.ObjectTracker) clienttesting.ReactionFunc {
	return func(a clienttesting.Action) (bool, runtime.Object, error) {
		gvr, ns := a.GetResource(), a.GetNamespace()
		if !loggedResources[gvr.Resource] || a.GetSubresource() != "" {
			return false, nil, nil
		}
		next := l.current() + 1 // no other writer: the fake's lock is held
		var obj runtime.Object
		var typ watch.EventType
		var err error
		switch a.GetVerb() {
		case "list":
			lk, ok := a.(interface {
				GetKind() schema.GroupVersionKind
			})
			if !ok {
				return false, nil, nil
			}
			list, err := t.List(gvr, lk.GetKind(), ns)
			if err != nil {
				return true, nil, err
			}
			lm, err := meta.ListAccessor(list)
			if err == nil {
				lm.SetResourceVersion(strconv.FormatInt(l.current(), 10))
			}
			return true, list, err
		case "create", "update":
			obj = a.(clienttesting.CreateAction).GetObject() // the action is the fake's copy
			if err = setRV(obj, next); err != nil {
				return true, nil, err
			}
			typ = watch.Added
			if a.GetVerb() == "create" {
				err = t.Create(gvr, obj, ns)
			} else {
				typ, err = watch.Modified, t.Update(gvr, obj, ns)
			}
		case "delete":
			name := a.(clienttesting.DeleteAction).GetName()
			if obj, err = t.Get(gvr, ns, name); err == nil {
				// The deleted object's last state, at the deletion's version,
				// as kube-apiserver sends it.
				_ = setRV(obj, next)
				typ, err = watch.Deleted, t.Delete(gvr, ns, name)
			}
		default:
			return false, nil, nil
		}
		if err != nil {
			return true, nil, err
		}
		if m, _ := meta.Accessor(obj); m != nil {
			ns = m.GetNamespace()
		}
		l.append(logEvent{rv: next, typ: typ, resource: gvr.Resource, ns: ns, obj: obj})
		return true, obj.DeepCopyObject(), nil // the caller may write to what it gets
	}
}

func setRV(obj runtime.Object, rv int64) error {
	m, err := meta.Accessor(obj)
	if err == nil {
		m.SetResourceVersion(strconv.FormatInt(rv, 10))
	}
	return err
}

// objectRV is the resourceVersion an object is served with: its own, or
// baseRV for one never changed through the server.
func objectRV(o runtime.Object) string {
	if m, err := meta.Accessor(o); err == nil && m.GetResourceVersion() != "" {
		return m.GetResourceVersion()
	}
	return strconv.Itoa(baseRV)
}

// initialEventsEnd is the bookmark that ends a watch-list's initial
// events (or, without the annotation, a periodic bookmark) at rv.
func initialEventsEnd(empty runtime.Object, rv int64, initial bool) runtime.Object {
	m, _ := meta.Accessor(empty)
	m.SetResourceVersion(strconv.FormatInt(rv, 10))
	if initial {
		m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
	}
	return empty
}
