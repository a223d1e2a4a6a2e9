package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// streamedLister lists a collection by streaming it: one watch with
// sendInitialEvents (the API server's watch-list, KEP 3157) whose events
// are read and decoded in the lister's own goroutine, each object
// transformed as it is decoded, and handed to the reflector as one list,
// complete at the initial-events-end bookmark. The reflector then watches
// on from the bookmark's resourceVersion as after any list.
//
// Why not client-go's own watch-list (the reflector's WatchListClient
// path): it reads the clock for every event, keys every object into a
// temporary store, and its watch hands each event from the decoding
// goroutine to the reflector's over a channel — two goroutine switches
// per object, each a clock read in the scheduler. Where a clock read is a
// system call (user-mode Linux; VMs whose clocksource has no vDSO read)
// those were the largest items of the proxy's start-up. At 10,000
// services in the sandbox this lister delivers the informers' lists in
// 4.7–5.0 s for 3.1 s of CPU, against 8.1–9.4 s and 6.2–7.2 s through
// client-go's (docs/benchmarks.md, session 23). Why not plain lists: a
// LIST holds every object in full, untransformed, until its last page
// has arrived (peak RSS 124 MB against 92–100 MB at 10,000; at 100,000
// hundreds of megabytes on every node).
//
// Without a stream to open (client-go's fake client), and once the API
// server has refused one (older than watch-list, watch-list disabled, a
// content type it cannot stream), it lists.
type streamedLister struct {
	lw        cache.ListerWatcherWithContext
	open      openStream
	transform cache.TransformFunc // nil: objects as decoded
	what      string
	stream    atomic.Bool
}

// openStream opens a watch and returns its events' decoder.
type openStream func(ctx context.Context, o metav1.ListOptions) (eventDecoder, error)

// eventDecoder reads and decodes a watch's events in its caller's
// goroutine (client-go's rest/watch.Decoder).
type eventDecoder interface {
	Decode() (watch.EventType, runtime.Object, error)
	Close()
}

// streamTimeout bounds a streamed list as client-go bounds its own
// watch-lists (at most 10 minutes); a stream that ends before its
// bookmark is an unavailable API server (promptListWatch retries it).
const streamTimeout = 10 * time.Minute

func newStreamedLister(what string, lw cache.ListerWatcherWithContext, open openStream, transform cache.TransformFunc) *streamedLister {
	s := &streamedLister{lw: lw, open: open, transform: transform, what: what}
	s.stream.Store(open != nil)
	return s
}

func (s *streamedLister) ListWithContext(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
	if !s.stream.Load() || o.ResourceVersionMatch == metav1.ResourceVersionMatchExact {
		return s.lw.ListWithContext(ctx, o)
	}
	list, err := s.streamList(ctx, o)
	if err != nil && !retryStream(ctx, err) {
		s.stream.Store(false)
		klog.InfoS("The initial list could not be streamed; listing instead from now on", "resource", s.what, "err", err)
		return s.lw.ListWithContext(ctx, o)
	}
	if err != nil {
		return nil, err
	}
	klog.V(2).InfoS("Initial list streamed", "resource", s.what, "objects", len(list.Items), "resourceVersion", list.ResourceVersion)
	return list, nil
}

// retryStream tells the errors after which the next list streams again:
// an API server that is not answering now (promptListWatch retries), a
// resourceVersion too old (the reflector lists from the newest) and the
// end of the proxy. Any other error — an API server without watch-list
// forbids sendInitialEvents or resourceVersionMatch on a watch; a stream
// that does not decode — makes lists plain.
func retryStream(ctx context.Context, err error) bool {
	return ctx.Err() != nil || unavailable(err) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err)
}

func (s *streamedLister) WatchWithContext(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	return s.lw.WatchWithContext(ctx, o)
}

// streamList watches with the initial events and collects them until the
// bookmark that ends them.
func (s *streamedLister) streamList(ctx context.Context, o metav1.ListOptions) (*streamedList, error) {
	timeout := int64(streamTimeout.Seconds())
	o.Limit, o.Continue = 0, ""
	o.AllowWatchBookmarks = true
	o.SendInitialEvents = ptr.To(true)
	o.ResourceVersionMatch = metav1.ResourceVersionMatchNotOlderThan
	o.TimeoutSeconds = &timeout
	events, err := s.open(ctx, o)
	if err != nil {
		return nil, err
	}
	defer events.Close()
	list := &streamedList{}
	for {
		typ, obj, err := events.Decode()
		switch {
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
			return nil, fmt.Errorf("%w: the %s stream ended before its initial events did", io.ErrUnexpectedEOF, s.what)
		case err != nil:
			return nil, err
		}
		done, err := list.apply(typ, obj, s.transform)
		if err != nil {
			return nil, err
		}
		if done {
			return list, nil
		}
	}
}

// streamedList is a streamed list as the reflector takes it: a list
// object (meta.ListAccessor, meta.ExtractList) of the objects as the
// transform left them.
type streamedList struct {
	metav1.TypeMeta
	metav1.ListMeta
	Items []runtime.Object

	// index locates items by key; made only if the stream changes an
	// object it has already sent, which the API server does not do
	// before the bookmark.
	index map[string]int
}

// apply takes one event of the stream; done at the initial-events-end
// bookmark, whose resourceVersion the list then carries.
func (l *streamedList) apply(typ watch.EventType, obj runtime.Object, transform cache.TransformFunc) (done bool, err error) {
	switch typ {
	case watch.Bookmark:
		m, err := meta.Accessor(obj)
		if err != nil {
			return false, fmt.Errorf("bookmark: %w", err)
		}
		if m.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" {
			return false, nil
		}
		l.ResourceVersion = m.GetResourceVersion()
		return true, nil
	case watch.Error:
		return false, apierrors.FromObject(obj)
	case watch.Added, watch.Modified, watch.Deleted:
	default:
		return false, fmt.Errorf("unknown watch event %q", typ)
	}
	if transform != nil {
		t, err := transform(obj)
		if err != nil {
			return false, err
		}
		var ok bool
		if obj, ok = t.(runtime.Object); !ok {
			return false, fmt.Errorf("the transform made a %T, not an API object", t)
		}
	}
	if typ == watch.Added && l.index == nil {
		l.Items = append(l.Items, obj)
		return false, nil
	}
	return false, l.change(typ, obj)
}

// change adds, replaces or removes obj by its key.
func (l *streamedList) change(t watch.EventType, obj runtime.Object) error {
	if l.index == nil {
		l.index = make(map[string]int, len(l.Items))
		for i, o := range l.Items {
			k, err := cache.MetaNamespaceKeyFunc(o)
			if err != nil {
				return err
			}
			l.index[k] = i
		}
	}
	k, err := cache.MetaNamespaceKeyFunc(obj)
	if err != nil {
		return err
	}
	i, have := l.index[k]
	switch {
	case t == watch.Deleted && have:
		last := len(l.Items) - 1
		l.Items[i] = l.Items[last]
		l.index[keyOf(l.Items[i])] = i
		l.Items = l.Items[:last]
		delete(l.index, k)
	case t == watch.Deleted:
	case have:
		l.Items[i] = obj
	default:
		l.index[k] = len(l.Items)
		l.Items = append(l.Items, obj)
	}
	return nil
}

func keyOf(o runtime.Object) string {
	k, _ := cache.MetaNamespaceKeyFunc(o) // keyed before, when it was added
	return k
}

func (l *streamedList) DeepCopyObject() runtime.Object {
	out := &streamedList{TypeMeta: l.TypeMeta, Items: make([]runtime.Object, len(l.Items))}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	for i, o := range l.Items {
		out.Items[i] = o.DeepCopyObject()
	}
	return out
}
