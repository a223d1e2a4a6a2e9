//go:build e2e

package main

// The initial lists, encoded ahead. On a cluster the API server that
// serves a node's watch-lists runs on other machines; here it shares the
// guest's one CPU with the proxy, and reading the fake (each List deep
// copies a namespace) and encoding every object as it is sent took
// 28.5 s of the 220 s until Ready at 100,000 services (13 %; 1.2–1.8 s
// of 9–10 s at 10,000), CPU the proxy's start-up could not have. So the
// objects the proxy's watch-lists ask for are read and encoded once
// before it is launched (and again before the receive floor), untimed;
// a watch-list that asks for exactly them — protobuf, that label
// selector, no field selector, nothing changed since — is answered from
// those bytes. Anything else is read and encoded as it is served.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
)

// encodedLists are the ADDED events of every object of some collections
// matching one label selector, framed as a protobuf watch sends them,
// read at the change log's version rv.
type encodedLists struct {
	mu       sync.Mutex
	rv       int64
	selector string
	byName   map[string]*encodedList // by collection: services, endpointslices
}

// encodedList is one collection's events, namespace by namespace in the
// order the server reads them, and the version each namespace was read at.
type encodedList struct {
	events  [][]byte
	objects int
	read    map[string]int64
}

// encodeLists reads and encodes the collections' objects matching
// selector, replacing what was encoded before. It fails when the fake
// changed while it read (the lists would not be one version).
func (s *apiServer) encodeLists(selector string, collections ...string) error {
	start, bytes := time.Now(), 0
	rv := s.log.current()
	ew := &eventWriter{f: s.protobuf}
	sel := selection{opts: metav1.ListOptions{LabelSelector: selector}, fields: fields.Everything()}
	byName := map[string]*encodedList{}
	for _, res := range s.resources() {
		if !slices.Contains(collections, res.name) {
			continue
		}
		l := &encodedList{}
		var err error
		l.read, l.objects, err = s.eachInitial(context.Background(), res, sel, func(o runtime.Object) error {
			b, err := ew.encode(watch.Added, o)
			if err != nil {
				return err
			}
			l.events = append(l.events, slices.Clone(b))
			bytes += len(b)
			return nil
		})
		if err != nil {
			return fmt.Errorf("encode %s ahead: %w", res.name, err)
		}
		byName[res.name] = l
	}
	if now := s.log.current(); now != rv {
		return fmt.Errorf("encode %v ahead: the fake changed while it was read (version %d → %d)", collections, rv, now)
	}
	s.encoded.mu.Lock()
	s.encoded.rv, s.encoded.selector, s.encoded.byName = rv, normalSelector(selector), byName
	s.encoded.mu.Unlock()
	s.logf("api: %v encoded ahead at version %d: %.0f MB in %.1fs (untimed)", collections, rv, float64(bytes)/(1<<20), time.Since(start).Seconds())
	return nil
}

// encodeProxyLists encodes ahead what the proxy's informers stream at
// start; when that fails, they are served as any other list.
func encodeProxyLists(srv *apiServer) {
	if err := srv.encodeLists(proxySelector, "services", "endpointslices"); err != nil {
		logf("%v: served as they are read", err)
	}
}

// normalSelector is a label selector as the API machinery prints it
// (requirements sorted by key), so that two spellings of one compare
// equal.
func normalSelector(s string) string {
	sel, err := labels.Parse(s)
	if err != nil {
		return s
	}
	return sel.String()
}

// take returns the events encoded ahead for a watch-list of res with
// sel in contentType, when they answer it: protobuf, the same
// selectors, and no change since (at is the log's version now). They
// are handed out once: the proxy streams each list once at start, and at
// 100,000 services they are 130 MB of the benchmark's heap, whose
// collections would hold up its polls for the rest of the run.
func (e *encodedLists) take(res string, sel selection, contentType string, at int64) (*encodedList, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	l, ok := e.byName[res]
	if !ok || contentType != runtime.ContentTypeProtobuf || normalSelector(sel.opts.LabelSelector) != e.selector || !sel.fields.Empty() || at != e.rv {
		return nil, false
	}
	delete(e.byName, res)
	return l, true
}
