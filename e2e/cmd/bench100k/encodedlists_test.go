//go:build e2e

package main

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
)

// The proxy's selector spelled the other way round: the same selector.
const proxySelectorReversed = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless"

// TestWatchListsServedFromListsEncodedAhead: informers as the proxy's get
// every object from the lists encoded ahead, the same objects as read
// live (checkCaches), whichever way the selector is spelled.
func TestWatchListsServedFromListsEncodedAhead(t *testing.T) {
	w, srv, client := served(t, 1200)
	if err := srv.encodeLists(proxySelectorReversed, "services", "endpointslices"); err != nil {
		t.Fatal(err)
	}
	svcs, slices := informers(t, client, true)
	checkCaches(t, w, svcs, slices)
	want := int64(2 * (w.n + len(criticalServices)))
	if srv.encodedSent.Load() != want || srv.objectsSent.Load() != want {
		t.Errorf("served %s; want all %d objects encoded ahead", srv.summary(), want)
	}
	// Handed out once: informers started again are served as read.
	svcs, slices = informers(t, client, true)
	checkCaches(t, w, svcs, slices)
	if srv.encodedSent.Load() != want || srv.objectsSent.Load() != 2*want {
		t.Errorf("served %s; want the second lists read as they were served", srv.summary())
	}
}

// TestListsEncodedAheadNotServedAfterAChange: once the fake changed, a
// watch-list is read and encoded as it is served, and has the change.
func TestListsEncodedAheadNotServedAfterAChange(t *testing.T) {
	w, srv, client := served(t, 300)
	if err := srv.encodeLists(proxySelector, "services", "endpointslices"); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	svc, err := srv.cs.CoreV1().Services(namespace(7)).Get(ctx, serviceName(7), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Labels = map[string]string{"changed": "yes"}
	if _, err := srv.cs.CoreV1().Services(svc.Namespace).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	svcs, slices := informers(t, client, true)
	checkCaches(t, w, svcs, slices)
	if n := srv.encodedSent.Load(); n != 0 {
		t.Errorf("%d objects sent from lists encoded before a change", n)
	}
	o, _, _ := svcs.GetByKey(namespace(7) + "/" + serviceName(7))
	if o == nil || o.(metav1.Object).GetLabels()["changed"] != "yes" {
		t.Errorf("service 7 as served: %v, want the change", o)
	}
}

// TestListsEncodedAheadOnlyForTheirSelector: another selector, or JSON,
// is read and encoded as it is served; the lists are handed out once.
func TestListsEncodedAheadOnlyForTheirSelector(t *testing.T) {
	_, srv, _ := served(t, 10)
	if err := srv.encodeLists(proxySelector, "services"); err != nil {
		t.Fatal(err)
	}
	at := srv.log.current()
	for _, c := range []struct {
		name, res, sel, contentType string
		want                        bool
	}{
		{"another collection", "endpointslices", proxySelector, srv.protobuf.contentType, false},
		{"another selector", "services", "app=x", srv.protobuf.contentType, false},
		{"JSON", "services", proxySelector, srv.json.contentType, false},
		{"the same spelled otherwise, last: it takes them", "services", proxySelectorReversed, srv.protobuf.contentType, true},
		{"the same again", "services", proxySelector, srv.protobuf.contentType, false},
	} {
		sel := selection{opts: metav1.ListOptions{LabelSelector: c.sel}, fields: fields.Everything()}
		if _, ok := srv.encoded.take(c.res, sel, c.contentType, at); ok != c.want {
			t.Errorf("%s: served from the lists encoded ahead %v, want %v", c.name, ok, c.want)
		}
	}
}
